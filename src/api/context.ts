/**
 * What the API's parts share, as types only: the services a daemon serves and the context every route
 * registration gets. Declared apart from app.ts (which imports the routes and extensions) so that the routes and
 * extensions need not import app.ts back: no import cycle, type-only ones included.
 */
import type { SandboxService, SnapshotService } from "../controller/sandbox-service.js";
import type { Token } from "./auth.js";
import type { DaemonMetrics } from "./metrics.js";

export interface DaemonServices {
  sandboxes: SandboxService;
  snapshots: SnapshotService;
}

export interface ApiContext {
  services: DaemonServices;
  snapshotsDir: string;
  metrics: DaemonMetrics;
  /** See ApiOptions.daemonTokens (app.ts). */
  daemonTokens: readonly Token[];
}
