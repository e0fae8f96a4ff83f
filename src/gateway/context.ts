/**
 * What the gateway's parts share: the cluster view, the directory, the links to nodes and the calls over them,
 * placement, admission, the sandbox locator and the relay. Made once per gateway process (server.ts).
 */
import type { Logger } from "pino";
import type { TenantAdmission } from "./admission.js";
import type { GatewayAuth } from "./auth.js";
import type { ClusterView } from "./cluster-view.js";
import type { Directory } from "./directory.js";
import type { SandboxLocator } from "./locate.js";
import type { NodeCaller } from "./node-calls.js";
import type { NodeLinks } from "./node-links.js";
import type { Placer } from "./placement.js";
import type { NodeProxy } from "./proxy.js";
import type { Spawner } from "./spawn.js";

export interface RegistrySettings {
  /** Plain HTTP or unverified TLS to registries that are not on loopback (ForkdSnapshots' references). */
  insecure: boolean;
}

export interface GatewayContext {
  view: ClusterView;
  directory: Directory;
  links: NodeLinks;
  calls: NodeCaller;
  placer: Placer;
  locator: SandboxLocator;
  admission: TenantAdmission;
  spawner: Spawner;
  proxy: NodeProxy;
  auth: GatewayAuth;
  nodeToken: string;
  registry: RegistrySettings;
  /** The snapshot E2B's default template names (base, code-interpreter-v1) mean. */
  defaultSnapshot: string;
  /**
   * `--durable-pause`: every pause with memory through this gateway is durable (E2B's, and forkd's that do not
   * say `durable: false`); durable-pause.ts.
   */
  durablePause: boolean;
  logger: Logger;
}
