/**
 * Bearer tokens for the TCP listener. Tokens come from a file (one per line, so a new token can be added before
 * the old one is removed); each is at least MIN_TOKEN_BYTES and is compared in constant time. A token is never
 * logged: the audit log names it by a short hash (`token:<8 hex>`).
 */
import { readFile, stat } from "node:fs/promises";
import { ForkdError } from "../common/errors.js";
import { matchToken, type Token, tokenFromString } from "../common/tokens.js";

export { MIN_TOKEN_BYTES, type Token, tokenFromString } from "../common/tokens.js";

/** More would only be a mistake (a binary or a key file given as the token file). */
const MAX_TOKEN_FILE_BYTES = 64 * 1024;

/**
 * Reads a token file: one token per line; blank lines and `#` comments skipped. The file must be the daemon's
 * own and private (no group or other permission bits): a token readable or replaceable by another local user
 * hands that user root.
 */
export async function loadTokenFile(file: string): Promise<Token[]> {
  const info = await stat(file).catch((err: NodeJS.ErrnoException) => {
    throw new ForkdError("invalid_argument", `cannot read token file ${file}: ${err.code ?? err.message}`);
  });
  if (!info.isFile()) throw new ForkdError("invalid_argument", `token file ${file} is not a regular file`);
  if (info.size > MAX_TOKEN_FILE_BYTES) {
    throw new ForkdError(
      "invalid_argument",
      `token file ${file} is larger than ${MAX_TOKEN_FILE_BYTES} bytes`,
    );
  }
  const uid = process.getuid?.();
  if (uid !== undefined && info.uid !== uid) {
    throw new ForkdError(
      "invalid_argument",
      `token file ${file} is owned by uid ${info.uid}, not by the daemon's user (uid ${uid}): chown it`,
    );
  }
  if (info.mode & 0o077) {
    const what = info.mode & 0o022 ? "writable" : "readable";
    throw new ForkdError(
      "invalid_argument",
      `token file ${file} is ${what} by other users (mode ${(info.mode & 0o777).toString(8)}): chmod 600 it`,
    );
  }
  const text = await readFile(file, "utf8");
  const tokens = text
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"))
    .map((line, i) => tokenFromString(line, `token on line ${i + 1} of ${file}`));
  if (tokens.length === 0) throw new ForkdError("invalid_argument", `token file ${file} holds no token`);
  return tokens;
}

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
