/** A sandbox's data-plane secrets as the service hands them out and checks them (settings.ts makes them). */

import { isValidSandboxId } from "../../common/names.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { AccessTokens } from "../sandbox-service.js";
import { newAccessToken, tokenMatches } from "./settings.js";

/** `row`'s secrets; a sandbox spawned before the daemon made secrets gets its own now. */
export function accessTokensOf(db: Pick<StateDb, "updateSandbox">, row: SandboxRow): AccessTokens {
  if (row.access_token !== null && row.traffic_token !== null) {
    return { envd: row.access_token, traffic: row.traffic_token };
  }
  // Sandboxes spawned before the daemon made secrets get theirs on first use.
  const tokens = {
    envd: row.access_token ?? newAccessToken(),
    traffic: row.traffic_token ?? newAccessToken(),
  };
  db.updateSandbox(row.id, { access_token: tokens.envd, traffic_token: tokens.traffic });
  return tokens;
}

/** Whether `token` is sandbox `id`'s secret of that kind (constant time); false for unknown sandboxes. */
export function verifyAccessToken(
  db: Pick<StateDb, "sandbox">,
  id: string,
  kind: keyof AccessTokens,
  token: string | undefined,
): boolean {
  if (!isValidSandboxId(id)) return false;
  const row = db.sandbox(id);
  if (!row) return false;
  return tokenMatches(token, kind === "envd" ? row.access_token : row.traffic_token);
}
