/**
 * Connections per tenant. Every listener has a bounded number of connection slots (src/api/app.ts
 * maxConnections) and a proxied response or upgrade may hold one for many minutes, so one tenant (its callers,
 * or the public traffic to its sandboxes' ports) could take them all. A connection counts for the tenant whose
 * view it first reaches the services as (request-scope.ts), until it closes; a request on a connection that
 * would pass the tenant's bound is refused with 429. Admins are not counted.
 */
import type { Socket } from "node:net";
import { ForkdError } from "../common/errors.js";

/** Connections one tenant may hold at once, by default: a quarter of a listener's slots. */
export const DEFAULT_TENANT_MAX_CONNECTIONS = 256;

export class ConnectionBudget {
  private readonly byTenant = new Map<string, Set<Socket>>();

  constructor(readonly perTenant = DEFAULT_TENANT_MAX_CONNECTIONS) {}

  /** Counts `socket` for `tenant` (once; released when it closes), or throws `too_many_requests`. */
  admit(tenant: string, socket: Socket): void {
    let held = this.byTenant.get(tenant);
    if (held?.has(socket)) return;
    if (socket.destroyed) return;
    if ((held?.size ?? 0) >= this.perTenant) {
      throw new ForkdError(
        "too_many_requests",
        `tenant ${tenant} holds ${held?.size} connections to the daemon (limit ${this.perTenant}); close some and retry`,
      );
    }
    if (!held) {
      held = new Set();
      this.byTenant.set(tenant, held);
    }
    held.add(socket);
    socket.once("close", () => {
      const set = this.byTenant.get(tenant);
      set?.delete(socket);
      if (set?.size === 0) this.byTenant.delete(tenant);
    });
  }

  /** Connections `tenant` holds now. */
  held(tenant: string): number {
    return this.byTenant.get(tenant)?.size ?? 0;
  }
}
