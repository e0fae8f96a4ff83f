/** One daemon per FORKD_HOME: the lock is exclusive, released on close and released by the kernel on SIGKILL. */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { ForkdError } from "../../src/common/errors.js";
import { lockHome } from "../../src/common/home-lock.js";
import { resolvePaths } from "../../src/common/paths.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";

const dirs: string[] = [];
const home = async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-lock-"));
  dirs.push(dir);
  return dir;
};

describe("FORKD_HOME lock", () => {
  after(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  });

  it("refuses a second holder until the first releases it; other homes are independent", async () => {
    const a = await home();
    const first = await lockHome(a);
    await assert.rejects(
      lockHome(a),
      (err: unknown) =>
        err instanceof ForkdError && err.code === "conflict" && /already running/.test(err.message),
    );
    await assert.rejects(lockHome(`${a}/.`), /already running/, "the same directory spelled differently");
    const other = await lockHome(await home());
    await other.release();
    await first.release();
    const again = await lockHome(a);
    await again.release();
  });

  it("the daemon's services take it: a second daemon on the same FORKD_HOME is refused", async () => {
    const paths = resolvePaths({ FORKD_HOME: await home() });
    const first = await openServices(paths);
    await assert.rejects(openServices(paths), /another forkd daemon is already running/);
    await first.close();
    const second = await openServices(paths);
    await second.close();
  });

  it("is released when its holder is SIGKILLed", async () => {
    const a = await home();
    const lockModule = fileURLToPath(new URL("../../src/common/home-lock.js", import.meta.url));
    const holder = spawn(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        `const { lockHome } = await import(${JSON.stringify(lockModule)}); await lockHome(${JSON.stringify(a)}); console.log("held"); setInterval(() => {}, 1000);`,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    await once(holder.stdout as NodeJS.ReadableStream, "data");
    await assert.rejects(lockHome(a), /already running/);
    holder.kill("SIGKILL");
    await once(holder, "exit");
    const mine = await lockHome(a);
    await mine.release();
  });
});
