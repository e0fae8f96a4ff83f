/**
 * Prometheus metrics of one daemon (prom-client, a registry per daemon so tests can run several). Gauges that
 * describe state (sandboxes, snapshots, memory) are computed at scrape time from the services, never kept in step
 * by hand. v0.5's names (forkd_snapshots_total, forkd_sandboxes_active, forkd_branches_in_flight,
 * forkd_branch_concurrency_cap, forkd_build_info) are kept.
 */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { SandboxService, SnapshotService } from "../controller/sandbox-service.js";
import type { SpawnObserver } from "../controller/sandboxes/spawn-observer.js";

/** From a warm restore under KVM (~10 ms) to 1000 children under TCG (minutes). */
const SPAWN_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
/** From a trivial exec under KVM (~1 ms) to long-running commands. */
const EXEC_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export interface DaemonMetrics {
  registry: Registry;
  spawnDuration: Histogram<"outcome">;
  sandboxReady: Histogram;
  /** Feeds spawnDuration and sandboxReady from every spawn, whichever face asked (controller's observeSpawns). */
  spawns: SpawnObserver;
  execDuration: Histogram<"op" | "outcome">;
  httpRequests: Counter<"method" | "route" | "status">;
  httpErrors: Counter<"method" | "route" | "code">;
}

export function createMetrics(
  services: { sandboxes: SandboxService; snapshots: SnapshotService },
  build: { version: string },
): DaemonMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "forkd_daemon_" });
  new Gauge({
    name: "forkd_build_info",
    help: "Build of the daemon; always 1, the labels carry the version.",
    labelNames: ["version", "api"],
    registers: [registry],
  }).set({ version: build.version, api: "v1" }, 1);
  registerSandboxGauges(registry, services.sandboxes);
  registerSnapshotGauges(registry, services.snapshots);
  return { registry, ...spawnHistograms(registry), ...requestMetrics(registry) };
}

/** Sandboxes and BRANCHes now, and each sandbox's host memory: read from the services at scrape time. */
function registerSandboxGauges(registry: Registry, sandboxes: SandboxService): void {
  new Gauge({
    name: "forkd_sandboxes_active",
    help: "Sandboxes starting or running.",
    registers: [registry],
    collect() {
      this.set(activeSandboxes(sandboxes).length);
    },
  });
  new Gauge({
    name: "forkd_branches_in_flight",
    help: "BRANCHes admitted and not yet answered (the v0.5 name).",
    registers: [registry],
    collect() {
      this.set(sandboxes.branchLoad().inFlight);
    },
  });
  new Gauge({
    name: "forkd_branch_concurrency_cap",
    help: "BRANCHes allowed in flight at once; more are answered 503 (--branch-concurrency; the v0.5 name).",
    registers: [registry],
    collect() {
      this.set(sandboxes.branchLoad().cap);
    },
  });
  new Gauge({
    name: "forkd_sandbox_memory_bytes",
    help:
      "Host memory of each sandbox's QEMU process (rss: resident; pss: shared pages divided among sharers; " +
      "private: pages only it holds).",
    labelNames: ["id", "snapshot_tag", "kind"],
    registers: [registry],
    async collect() {
      this.reset();
      const tags = new Map(activeSandboxes(sandboxes).map((sb) => [sb.id, sb.snapshot_tag]));
      for (const usage of await sandboxes.usage().catch(() => [])) {
        const snapshot_tag = tags.get(usage.id);
        if (snapshot_tag === undefined) continue;
        this.set({ id: usage.id, snapshot_tag, kind: "rss" }, usage.rss_bytes);
        this.set({ id: usage.id, snapshot_tag, kind: "pss" }, usage.pss_bytes);
        this.set({ id: usage.id, snapshot_tag, kind: "private" }, usage.private_bytes);
      }
    },
  });
}

/** Snapshots and their bytes, read at scrape time. */
function registerSnapshotGauges(registry: Registry, snapshots: SnapshotService): void {
  new Gauge({
    name: "forkd_snapshot_bytes",
    help: "Bytes of each snapshot's files.",
    labelNames: ["tag"],
    registers: [registry],
    async collect() {
      this.reset();
      for (const snap of await snapshots.list().catch(() => [])) this.set({ tag: snap.tag }, snap.bytes);
    },
  });
  new Gauge({
    name: "forkd_snapshots_total",
    help: "Snapshots known to the daemon (a gauge; the name is forkd v0.5's).",
    registers: [registry],
    async collect() {
      this.set((await snapshots.list().catch(() => [])).length);
    },
  });
}

/** Spawn and readiness times, fed by the controller's spawn observer (every face's spawns). */
function spawnHistograms(
  registry: Registry,
): Pick<DaemonMetrics, "spawnDuration" | "sandboxReady" | "spawns"> {
  const spawnDuration = new Histogram({
    name: "forkd_spawn_duration_seconds",
    help:
      "A spawn, whichever API asked (forkd POST /v1/sandboxes, E2B's create), request to all n children ready " +
      "(or to its failure).",
    labelNames: ["outcome"],
    buckets: SPAWN_BUCKETS,
    registers: [registry],
  });
  const sandboxReady = new Histogram({
    name: "forkd_sandbox_ready_seconds",
    help: "Per spawned sandbox: restore to ready.",
    buckets: SPAWN_BUCKETS,
    registers: [registry],
  });
  return {
    spawnDuration,
    sandboxReady,
    spawns: {
      spawnEnded: (outcome, seconds) => spawnDuration.observe({ outcome }, seconds),
      sandboxReady: (readyMs) => sandboxReady.observe(readyMs / 1000),
    },
  };
}

/** Exec times and the requests and errors by route, kept by the API's handlers and hooks. */
function requestMetrics(
  registry: Registry,
): Pick<DaemonMetrics, "execDuration" | "httpRequests" | "httpErrors"> {
  return {
    execDuration: new Histogram({
      name: "forkd_exec_duration_seconds",
      help: "exec / exec_stream / eval, request to result.",
      labelNames: ["op", "outcome"],
      buckets: EXEC_BUCKETS,
      registers: [registry],
    }),
    httpRequests: new Counter({
      name: "forkd_http_requests_total",
      help: "Requests by route and status.",
      labelNames: ["method", "route", "status"],
      registers: [registry],
    }),
    httpErrors: new Counter({
      name: "forkd_http_errors_total",
      help: "Error responses (4xx/5xx) by route and catalogue code.",
      labelNames: ["method", "route", "code"],
      registers: [registry],
    }),
  };
}

function activeSandboxes(sandboxes: SandboxService) {
  return sandboxes.list().filter((sb) => sb.status === "starting" || sb.status === "running");
}
