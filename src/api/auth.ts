/**
 * Bearer tokens for the TCP listener. Tokens come from a file (one per line, so a new token can be added before
 * the old one is removed); each is at least MIN_TOKEN_BYTES and is compared in constant time. A token is never
 * logged: the audit log names it by a short hash (`token:<8 hex>`, then `:<tenant>` for a tenant's token).
 */
import { ForkdError } from "../common/errors.js";
import { matchToken, type Token } from "../common/tokens.js";

export {
  checkTokenFileAccess,
  loadTokenFile,
  MIN_TOKEN_BYTES,
  type Token,
  tokenFromString,
} from "../common/tokens.js";

/**
 * The token a request presents, checked against every configured token without an early exit, so the time taken
 * says nothing about which token (or which prefix) matched.
 */
export function authenticate(header: string | undefined, tokens: readonly Token[]): Token {
  if (!header)
    throw new ForkdError("unauthorized", "missing bearer token (send Authorization: Bearer <token>)");
  const match = /^Bearer[ ]+(\S+)[ ]*$/i.exec(header);
  if (!match)
    throw new ForkdError("unauthorized", "malformed Authorization header: expected 'Bearer <token>'");
  const found = matchToken(match[1] as string, tokens);
  if (!found) throw new ForkdError("unauthorized", "invalid bearer token");
  return found;
}
