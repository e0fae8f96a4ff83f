/** What the E2B surfaces share: the daemon's services, its API keys, and the caches they keep. */
import type { FastifyRequest } from "fastify";
import { ForkdError } from "../common/errors.js";
import type { Token } from "../common/tokens.js";
import type { SandboxService, SnapshotService } from "../controller/sandbox-service.js";
import { type Principal, type Services, servicesFor } from "../controller/tenancy/tenant-view.js";
import { TemplateFacts } from "./control/template-facts.js";
import { GuestUsers } from "./envd/guest-users.js";
import { Watchers } from "./envd/watchers.js";

export interface E2bOptions {
  services: { sandboxes: SandboxService; snapshots: SnapshotService };
  /**
   * The daemon's tokens, accepted as E2B API keys (X-API-Key). Empty: no key is required (the Unix socket: every
   * TCP listener has tokens), as on the forkd API.
   */
  tokens: readonly Token[];
  /**
   * Every token of the daemon (whichever listener takes it): removed from requests proxied to a sandbox's
   * ports, so no client's daemon credential ever reaches a guest. Default: `tokens`.
   */
  daemonTokens?: readonly Token[];
  /** Base domain of sandbox host names (`<port>-<sandboxId>.<domain>`), returned as the sandboxes' domain. */
  domain?: string;
  /** Largest upload one POST /files may carry (default MAX_UPLOAD_BYTES, 1 GiB). */
  maxUploadBytes?: number;
  /**
   * Every sandbox's ports need its traffic access token, whatever its creator asked (E2B's default is public:
   * anyone who reaches the listener and knows the sandbox id). For hosts whose other users are not trusted.
   */
  privateTraffic?: boolean;
}

/** The daemon's E2B settings (flags of `forkd daemon`). */
export type E2bSettings = Pick<E2bOptions, "domain" | "maxUploadBytes" | "privateTraffic">;

export interface E2bContext extends E2bOptions {
  facts: TemplateFacts;
  users: GuestUsers;
  watchers: Watchers;
}

declare module "fastify" {
  interface FastifyContextConfig {
    /** An E2B route: it authenticates its callers itself (API key or the sandbox's access token). */
    e2b?: boolean;
    /** A Connect call of envd's: refusals are answered as Connect errors. */
    connect?: boolean;
  }
  interface FastifyRequest {
    /** Who made the request, for the audit log (declared by src/api too; the declarations merge). */
    caller: string;
    auditIds: string[];
    /** Who the request acts for (declared by src/api too): set by the control plane's key check. */
    principal: Principal | null;
  }
}

const scoped = new WeakMap<FastifyRequest, Services>();

/**
 * The services as a control-plane request's principal may use them (controller/tenancy: a tenant's API key
 * sees only its own sandboxes and snapshots). The data plane needs none: a sandbox's own secrets open it.
 */
export function servicesOf(request: FastifyRequest, context: E2bContext): Services {
  let services = scoped.get(request);
  if (services === undefined) {
    if (request.principal === null) {
      throw new ForkdError("internal", "E2B request reached a route without an authenticated principal");
    }
    services = servicesFor(context.services, request.principal);
    scoped.set(request, services);
  }
  return services;
}

/**
 * One context per listener (registerE2b): its caches (template facts, guest users) and its pollable watchers,
 * which a client polls on the listener it created them on.
 */
export function createE2bContext(options: E2bOptions): E2bContext {
  return {
    ...options,
    facts: new TemplateFacts(options.services.snapshots),
    users: new GuestUsers(options.services.sandboxes),
    watchers: new Watchers(options.services.sandboxes),
  };
}
