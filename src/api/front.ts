/**
 * A trusted front: a component that stands before this listener and has authenticated the caller already (the
 * cluster gateway before a node daemon, src/cluster-node). Every request and upgrade on such a listener must
 * carry the front's credential, checked before anything else runs; it then acts for the principal the front
 * names. The front's headers are removed once checked, so they never reach a route, a log or a guest. The API
 * calls this interface; it imports nothing of the layer that implements it.
 */
import type { IncomingMessage } from "node:http";
import type { Principal } from "./principal.js";

export interface FrontAdmission {
  principal: Principal;
  /** What the audit log calls the caller. */
  caller: string;
}

export interface TrustedFront {
  /**
   * Checks the front's credential on `req` and removes the front's headers; returns who the request acts for.
   * Throws a ForkdError (401 without the credential, 503 or 409 when this node may not take the call now).
   */
  admit(req: IncomingMessage): FrontAdmission;
}

/** Kubelet probes call /healthz without credentials. */
export function isProbe(url: string | undefined): boolean {
  const path = (url ?? "").split("?")[0];
  return path === "/healthz" || path === "/healthz/";
}
