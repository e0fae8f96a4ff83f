/**
 * What the forkd API's route modules are given by app.ts. No services: a route reaches those only as the caller's
 * view, servicesOf(request) (src/http/request-scope.ts).
 */
import type { Token } from "../common/tokens.js";
import type { Services } from "../controller/tenancy/tenant-view.js";
import type { DaemonMetrics } from "./metrics.js";

/** The daemon's services (SandboxService, SnapshotService), as the composition hands them to a listener. */
export type DaemonServices = Services;

export interface ApiContext {
  /** Where snapshots live on the host (reported as SnapshotInfo.dir). */
  snapshotsDir: string;
  metrics: DaemonMetrics;
  /** Every token of the daemon: removed from requests the port proxy passes on to a sandbox (ApiOptions). */
  daemonTokens: readonly Token[];
}
