/**
 * Who calls the gateway. Users' tokens and their tenants live here, never on the nodes: the operator's admin
 * token (`--admin-token-file`, the tokens Secret's admin-token) and users' tokens (`--token-file`, one per line,
 * `<token> tenant=<name>` for a tenant's, as on a single daemon). The forkd API and MCP take them as bearer
 * tokens, E2B's control plane as X-API-Key (or bearer); E2B's data plane needs none of them (a node checks the
 * sandbox's own access tokens, as a single daemon does).
 */
import type { IncomingHttpHeaders } from "node:http";
import { authenticate } from "../api/auth.js";
import { ForkdError } from "../common/errors.js";
import { matchToken, type Token } from "../common/tokens.js";

export interface Caller {
  /** null: an admin. */
  tenant: string | null;
  /** What the gateway's log calls the caller. */
  id: string;
}

export class GatewayAuth {
  constructor(readonly tokens: readonly Token[]) {
    if (tokens.length === 0) throw new ForkdError("invalid_argument", "the gateway needs at least one token");
  }

  /** A forkd API or MCP call: `Authorization: Bearer <token>`. */
  bearer(headers: IncomingHttpHeaders): Caller {
    const token = authenticate(headers.authorization, this.tokens);
    return { tenant: token.tenant, id: token.id };
  }

  /** An E2B control-plane call: X-API-Key, or a bearer token. */
  apiKey(headers: IncomingHttpHeaders): Caller {
    const header = headers["x-api-key"];
    const bearer = /^Bearer[ ]+(\S+)[ ]*$/i.exec(headers.authorization ?? "")?.[1];
    const key = (Array.isArray(header) ? header[0] : header) ?? bearer;
    if (key === undefined || key === "") {
      throw new ForkdError("unauthorized", "missing API key: send X-API-Key: <a forkd token>");
    }
    const token = matchToken(key, this.tokens);
    if (!token) throw new ForkdError("unauthorized", "invalid API key");
    return { tenant: token.tenant, id: token.id };
  }
}
