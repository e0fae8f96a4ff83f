/**
 * A Python venv with the test requirements (test/e2b/python/requirements.txt: the newest `e2b`,
 * `e2b-code-interpreter`, pytest and the frameworks the tests drive), installed with the machine's own pip
 * configuration and made once per run: it lives outside the repository like the guest images, keyed by the
 * requirements and the interpreter, and is upgraded in place when older than FORKD_PYTHON_VENV_MAX_AGE_H hours
 * (default 12), so a CI run on a fresh machine always installs the newest releases and reruns reuse it.
 * Concurrent test processes (several checkouts) wait for the one installing.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { ForkdError } from "../../src/common/errors.js";
import { type HomeLock, lockHome } from "../../src/common/home-lock.js";
import { packageRoot } from "../../src/image/package-root.js";

const execFileAsync = promisify(execFile);
const CACHE_ROOT = process.env.FORKD_PYTHON_VENV_CACHE ?? "/var/cache/forkd/python-venvs";
const MAX_AGE_MS = Number(process.env.FORKD_PYTHON_VENV_MAX_AGE_H ?? 12) * 3600_000;
/** Debian's interpreter (python3-venv), unless the caller names another. */
const PYTHON =
  process.env.FORKD_TEST_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");
export const PYTHON_TESTS_DIR = path.join(packageRoot(), "test", "e2b", "python");
const STAMP = "forkd-installed-at";

export interface PythonVenv {
  dir: string;
  python: string;
  /** `name==version` of every installed distribution (what the tests ran against). */
  versions: Record<string, string>;
}

export async function e2bPythonVenv(): Promise<PythonVenv> {
  const requirements = path.join(PYTHON_TESTS_DIR, "requirements.txt");
  const text = await readFile(requirements, "utf8");
  const { stdout: version } = await run(PYTHON, ["-c", "import sys; print(sys.version)"]);
  const key = createHash("sha256").update(text).update(version).digest("hex").slice(0, 16);
  const dir = path.join(CACHE_ROOT, `e2b-${key}`);
  const python = path.join(dir, "bin", "python");
  await mkdir(CACHE_ROOT, { recursive: true, mode: 0o755 });
  const lock = await waitForLock(dir);
  try {
    const installedAt = await stat(path.join(dir, STAMP)).then(
      (s) => s.mtimeMs,
      () => undefined,
    );
    if (installedAt === undefined) {
      await rm(dir, { recursive: true, force: true });
      await run(PYTHON, ["-m", "venv", dir]);
    }
    if (installedAt === undefined || Date.now() - installedAt > MAX_AGE_MS) {
      await run(python, ["-m", "pip", "install", "--quiet", "--upgrade", "-r", requirements]);
      await writeFile(path.join(dir, STAMP), `${new Date().toISOString()}\n`);
    }
  } finally {
    await lock.release();
  }
  const { stdout } = await run(python, [
    "-m",
    "pip",
    "list",
    "--format=freeze",
    "--disable-pip-version-check",
  ]);
  const versions = Object.fromEntries(
    stdout
      .trim()
      .split("\n")
      .map((line) => line.split("==") as [string, string]),
  );
  return { dir, python, versions };
}

async function run(file: string, args: string[]) {
  try {
    return await execFileAsync(file, args, { maxBuffer: 16 * 1024 * 1024, timeout: 20 * 60_000 });
  } catch (err) {
    const failed = err as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `${file} ${args.join(" ")} failed: ${failed.message}\n${failed.stdout ?? ""}${failed.stderr ?? ""}`,
    );
  }
}

async function waitForLock(dir: string): Promise<HomeLock> {
  for (;;) {
    try {
      return await lockHome(dir);
    } catch (err) {
      if (!(err instanceof ForkdError) || err.code !== "conflict") throw err;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}
