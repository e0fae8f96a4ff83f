/**
 * Runs a file of examples/ the way its header says a user runs it: a separate Node process through tsx, with
 * FORKD_URL pointing at a real forkd API (served here over a Unix socket from the test's own services) and
 * FORKD_SNAPSHOT naming the snapshot to fork from.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pino from "pino";
import { startDaemon } from "../../src/api/daemon.js";
import type { openServices } from "../../src/controller/sandboxes/manager.js";

/** The repository root, from src/ (tsx) or dist/ (built tests). */
export const REPO_ROOT = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "../..",
  import.meta.url.endsWith(".ts") ? "" : "..",
);

/** Runs `examples/<file>` against an API over `services`, forking from `snapshotTag`. */
export async function runExample(
  services: Awaited<ReturnType<typeof openServices>>,
  home: { home: string; snapshots: string },
  options: { file: string; snapshotTag: string; args?: string[] },
): Promise<{ stdout: string; stderr: string }> {
  const socketPath = path.join(home.home, "example-api.sock");
  const daemon = await startDaemon(
    { socketPath, auditLog: null, snapshotsDir: home.snapshots, logger: pino({ level: "warn" }) },
    // The services are the test's: the API must not close them when it stops.
    { ...services, close: async () => {} },
  );
  try {
    return await promisify(execFile)(
      process.execPath,
      ["--import", "tsx", path.join(REPO_ROOT, "examples", options.file), ...(options.args ?? [])],
      {
        cwd: REPO_ROOT,
        env: { ...process.env, FORKD_URL: `unix:${socketPath}`, FORKD_SNAPSHOT: options.snapshotTag },
        timeout: 10 * 60_000,
        maxBuffer: 16 * 1024 * 1024,
      },
    );
  } finally {
    await daemon.stop("example done");
  }
}
