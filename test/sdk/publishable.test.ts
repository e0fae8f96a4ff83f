/**
 * The SDK is publishable on its own: its compiled files plus the one file outside src/sdk it may import
 * (src/common/limits.js, forkd's table of limits and names) run from a directory that holds nothing else, with no
 * node_modules anywhere above it. (test/layering.test.ts checks the imports; this runs them.)
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { cp, mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { it } from "node:test";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const distSrc = path.resolve(
  here,
  here.includes(`${path.sep}dist${path.sep}`) ? "../../src" : "../../dist/src",
);

it("runs from its own files and src/common/limits.js alone", async () => {
  const dir = await mkdtemp(path.join(tmpdir(), "forkd-sdk-"));
  try {
    await mkdir(path.join(dir, "src", "common"), { recursive: true });
    await cp(path.join(distSrc, "sdk"), path.join(dir, "src", "sdk"), {
      recursive: true,
      filter: (source) => !source.endsWith(".map"),
    });
    await cp(path.join(distSrc, "common", "limits.js"), path.join(dir, "src", "common", "limits.js"));
    await writeFile(
      path.join(dir, "package.json"),
      JSON.stringify({ name: "forkd-sdk-probe", type: "module" }),
    );
    assert.ok((await readdir(path.join(dir, "src", "sdk"))).includes("index.js"), "copied the compiled SDK");
    const script = [
      'const sdk = await import("./src/sdk/index.js");',
      'const controller = new sdk.Controller({ url: "http://127.0.0.1:9", token: "t".repeat(16) });',
      "console.log(JSON.stringify({",
      "  exports: Object.keys(sdk).sort(),",
      "  url: sdk.DEFAULT_DAEMON_URL,",
      "  timeoutMs: sdk.DEFAULT_SANDBOX_TIMEOUT_MS,",
      "  address: controller.settings().address.display,",
      "}));",
    ].join("\n");
    const child = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
      cwd: dir,
      encoding: "utf8",
    });
    assert.equal(child.status, 0, child.stderr);
    const out = JSON.parse(child.stdout) as {
      exports: string[];
      url: string;
      timeoutMs: number;
      address: string;
    };
    for (const name of ["Controller", "Sandbox", "ForkdSdkError", "CommandExitError", "DEFAULT_DAEMON_URL"]) {
      assert.ok(out.exports.includes(name), `exports ${name}`);
    }
    assert.equal(out.url, "unix:/run/forkd/forkd.sock");
    assert.equal(out.timeoutMs, 300_000);
    assert.equal(out.address, "http://127.0.0.1:9");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
