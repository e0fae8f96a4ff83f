/**
 * Prometheus metrics of one daemon (prom-client, a registry per daemon so tests can run several). Gauges that
 * describe state (sandboxes, snapshots, memory) are computed at scrape time from the services, never kept in step
 * by hand. v0.5's names (forkd_snapshots_total, forkd_sandboxes_active, forkd_branches_in_flight,
 * forkd_branch_concurrency_cap, forkd_build_info) are kept.
 */
import { readFile } from "node:fs/promises";
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { SandboxService, SnapshotService } from "../controller/sandbox-service.js";

/** From a warm restore under KVM (~10 ms) to 1000 children under TCG (minutes). */
const SPAWN_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
/** From a trivial exec under KVM (~1 ms) to long-running commands. */
const EXEC_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export interface DaemonMetrics {
  registry: Registry;
  spawnDuration: Histogram<"outcome">;
  sandboxReady: Histogram;
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

  new Gauge({
    name: "forkd_sandboxes_active",
    help: "Sandboxes starting or running.",
    registers: [registry],
    collect() {
      this.set(activeSandboxes(services.sandboxes).length);
    },
  });

  new Gauge({
    name: "forkd_branches_in_flight",
    help: "BRANCHes admitted and not yet answered (the v0.5 name).",
    registers: [registry],
    collect() {
      this.set(services.sandboxes.branchLoad().inFlight);
    },
  });
  new Gauge({
    name: "forkd_branch_concurrency_cap",
    help: "BRANCHes allowed in flight at once; more are answered 503 (--branch-concurrency; the v0.5 name).",
    registers: [registry],
    collect() {
      this.set(services.sandboxes.branchLoad().cap);
    },
  });

  new Gauge({
    name: "forkd_sandbox_memory_bytes",
    help: "Host memory of each sandbox's QEMU process (rss: resident; pss: shared pages divided among sharers).",
    labelNames: ["id", "snapshot_tag", "kind"],
    registers: [registry],
    async collect() {
      this.reset();
      await Promise.all(
        activeSandboxes(services.sandboxes).map(async (sb) => {
          if (sb.pid === null) return;
          const memory = await processMemory(sb.pid);
          if (!memory) return;
          this.set({ id: sb.id, snapshot_tag: sb.snapshot_tag, kind: "rss" }, memory.rss);
          this.set({ id: sb.id, snapshot_tag: sb.snapshot_tag, kind: "pss" }, memory.pss);
        }),
      );
    },
  });

  new Gauge({
    name: "forkd_snapshot_bytes",
    help: "Bytes of each snapshot's files.",
    labelNames: ["tag"],
    registers: [registry],
    async collect() {
      this.reset();
      for (const snap of await services.snapshots.list().catch(() => []))
        this.set({ tag: snap.tag }, snap.bytes);
    },
  });
  new Gauge({
    name: "forkd_snapshots_total",
    help: "Snapshots known to the daemon (a gauge; the name is forkd v0.5's).",
    registers: [registry],
    async collect() {
      this.set((await services.snapshots.list().catch(() => [])).length);
    },
  });

  return {
    registry,
    spawnDuration: new Histogram({
      name: "forkd_spawn_duration_seconds",
      help: "POST /v1/sandboxes, request to response (all n children ready).",
      labelNames: ["outcome"],
      buckets: SPAWN_BUCKETS,
      registers: [registry],
    }),
    sandboxReady: new Histogram({
      name: "forkd_sandbox_ready_seconds",
      help: "Per sandbox: restore to ready.",
      buckets: SPAWN_BUCKETS,
      registers: [registry],
    }),
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

/** Rss and Pss of a process from /proc/<pid>/smaps_rollup; null if it is gone. */
async function processMemory(pid: number): Promise<{ rss: number; pss: number } | null> {
  const text = await readFile(`/proc/${pid}/smaps_rollup`, "utf8").catch(() => null);
  if (text === null) return null;
  const field = (name: string) => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB$`, "m").exec(text);
    return match ? Number(match[1]) * 1024 : 0;
  };
  return { rss: field("Rss"), pss: field("Pss") };
}
