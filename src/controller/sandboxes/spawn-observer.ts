/**
 * What the daemon learns of every spawn, whichever face asked for it (the forkd API and its v0.5 routes, E2B's
 * create, the MCP server and SDKs through them): how long it took and how it ended, and how long each sandbox
 * took to be ready. The API's Prometheus metrics implement the observer (src/api/metrics.ts); the controller
 * knows nothing of them.
 */
import type { SandboxService } from "../sandbox-service.js";

export interface SpawnObserver {
  /** A spawn ended: every child ready (`ok`) or none left behind (`error`), `seconds` after it was asked for. */
  spawnEnded(outcome: "ok" | "error", seconds: number): void;
  /** A sandbox of it is ready, `readyMs` after its restore began. */
  sandboxReady(readyMs: number): void;
}

/** `sandboxes` with every spawn reported to `observer`; everything else passes through unchanged. */
export function observeSpawns(sandboxes: SandboxService, observer: SpawnObserver): SandboxService {
  const spawn: SandboxService["spawn"] = async (request) => {
    const started = performance.now();
    const seconds = () => (performance.now() - started) / 1000;
    let spawned: Awaited<ReturnType<SandboxService["spawn"]>>;
    try {
      spawned = await sandboxes.spawn(request);
    } catch (err) {
      observer.spawnEnded("error", seconds());
      throw err;
    }
    observer.spawnEnded("ok", seconds());
    for (const sandbox of spawned) if (sandbox.ready_ms !== null) observer.sandboxReady(sandbox.ready_ms);
    return spawned;
  };
  // A proxy rather than a copy: the services are class instances whose methods live on their prototype.
  return new Proxy(sandboxes, {
    get(target, key) {
      if (key === "spawn") return spawn;
      const value: unknown = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}
