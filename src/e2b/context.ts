/**
 * What the E2B surfaces share: the daemon's API keys, its E2B settings, and the caches they keep. No services: a
 * route reaches those only as its caller's view, servicesOf(request) (src/http/request-scope.ts); the data plane's
 * sandbox sessions (session.ts) hold them to find the sandbox a request addresses and check its tokens.
 */
import type { Token } from "../common/tokens.js";
import type { SandboxService, SnapshotService } from "../controller/sandbox-service.js";
import { TemplateFacts } from "./control/template-facts.js";
import { GuestUsers } from "./envd/guest-users.js";
import { Watchers } from "./envd/watchers.js";
import { SandboxSessions } from "./session.js";

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

/** What registerE2b gives each surface's routes: E2bOptions without the services. */
export interface E2bContext extends Omit<E2bOptions, "services"> {
  facts: TemplateFacts;
  users: GuestUsers;
  watchers: Watchers;
  /** The data plane's sessions: which running sandbox a request addresses, and whether it holds its tokens. */
  sessions: SandboxSessions;
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
  }
}

/**
 * One context per listener (registerE2b): its caches (template facts, guest users) and its pollable watchers,
 * which a client polls on the listener it created them on.
 */
export function createE2bContext(options: E2bOptions): E2bContext {
  const { services, ...settings } = options;
  return {
    ...settings,
    facts: new TemplateFacts(),
    users: new GuestUsers(),
    watchers: new Watchers(),
    sessions: new SandboxSessions(services.sandboxes),
  };
}
