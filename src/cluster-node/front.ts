/**
 * The node daemon's front door in cluster mode (src/api/front.ts): every call must carry the cluster credential
 * (the node token, in CLUSTER_HEADERS.token: never a user's token, which only the gateway knows) and the epoch
 * the caller believes the node runs under. A call is refused while the node is starting or fencing, when it has
 * not renewed its Lease for a whole duration, and under any other epoch than its own: an older one is a stale
 * caller (it would act on sandboxes the cluster gave up), a newer one means the node was fenced and must catch
 * up (it reads its ForkdNode at once). The call then acts for the tenant the gateway names, under that tenant's
 * view, as if the tenant's own token had been used on a single daemon.
 */
import type { IncomingMessage } from "node:http";
import type { FrontAdmission, TrustedFront } from "../api/front.js";
import { CLUSTER_HEADERS } from "../cluster/protocol.js";
import { ForkdError } from "../common/errors.js";
import { isValidTenant, matchToken, type Token } from "../common/tokens.js";
import { ADMIN } from "../controller/tenancy/tenant-view.js";
import type { NodeMembership } from "./membership.js";

function single(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

export class ClusterFront implements TrustedFront {
  constructor(
    private readonly tokens: readonly Token[],
    private readonly membership: NodeMembership,
  ) {}

  admit(req: IncomingMessage): FrontAdmission {
    const presented = single(req, CLUSTER_HEADERS.token);
    const epochText = single(req, CLUSTER_HEADERS.epoch);
    const tenant = single(req, CLUSTER_HEADERS.tenant);
    // Gone before anything else reads the request (routes, logs, a guest behind the port proxy).
    for (const name of Object.values(CLUSTER_HEADERS)) delete req.headers[name];
    const token = presented === undefined ? undefined : matchToken(presented, this.tokens);
    if (!token) {
      throw new ForkdError(
        "unauthorized",
        `this forkd daemon is a cluster node: it takes calls only from the cluster's gateway (${CLUSTER_HEADERS.token})`,
      );
    }
    const node = this.membership.nodeName;
    const state = this.membership.state;
    if (state !== "serving") {
      throw new ForkdError("unavailable", `node ${node} is ${state}: it takes no calls now`);
    }
    if (!this.membership.holdsLease()) {
      throw new ForkdError(
        "unavailable",
        `node ${node} has not renewed its Lease for a whole lease duration: the cluster may count it lost`,
      );
    }
    if (epochText === undefined || !/^\d{1,15}$/.test(epochText)) {
      throw new ForkdError(
        "invalid_argument",
        `a cluster call names the node's epoch (${CLUSTER_HEADERS.epoch})`,
      );
    }
    const epoch = Number(epochText);
    if (epoch !== this.membership.epoch) {
      if (epoch > this.membership.epoch) this.membership.checkEpochSoon();
      throw new ForkdError(
        "conflict",
        `node ${node} runs under epoch ${this.membership.epoch}, the call was made under epoch ${epoch}`,
        { detail: { node_epoch: this.membership.epoch, call_epoch: epoch } },
      );
    }
    if (tenant !== undefined && !isValidTenant(tenant)) {
      throw new ForkdError("invalid_argument", `${CLUSTER_HEADERS.tenant} is not a tenant name`);
    }
    const principal = tenant === undefined ? ADMIN : { tenant };
    return { principal, caller: `cluster:${token.id}${tenant === undefined ? "" : `:${tenant}`}` };
  }
}
