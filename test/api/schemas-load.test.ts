/**
 * The API's wire contract stands apart from the engine: loading src/api/schemas.ts (what the OpenAPI generator, a
 * validator or a client reads) loads no module of the controller, vmm, store, image, net or isolation. Its limits
 * come from the one table, src/common/limits.ts. Checked in a fresh Node process whose loader hook records every
 * module it loads.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { it } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
/** The compiled tree (dist/): the modules a running daemon or client loads. */
const distRoot = path.resolve(here, here.includes(`${path.sep}dist${path.sep}`) ? "../.." : "../../dist");
const ENGINE = /\/src\/(controller|vmm|store|image|net|isolation)\//;

/** Every forkd module a fresh process loads to import `entry` (paths relative to dist/). */
async function modulesLoadedBy(entry: string): Promise<string[]> {
  const dir = await mkdtemp(path.join(tmpdir(), "forkd-load-"));
  try {
    await writeFile(
      path.join(dir, "hooks.mjs"),
      'import { writeSync } from "node:fs";\n' +
        "export async function load(url, context, next) {\n" +
        '  if (url.startsWith("file:")) writeSync(2, "loaded " + url + "\\n");\n' +
        "  return next(url, context);\n}\n",
    );
    await writeFile(
      path.join(dir, "register.mjs"),
      'import { register } from "node:module";\nregister("./hooks.mjs", import.meta.url);\n',
    );
    const script = `await import(${JSON.stringify(pathToFileURL(path.join(distRoot, entry)).href)});`;
    const child = spawnSync(
      process.execPath,
      ["--import", pathToFileURL(path.join(dir, "register.mjs")).href, "--input-type=module", "-e", script],
      { encoding: "utf8" },
    );
    assert.equal(child.status, 0, child.stderr);
    const prefix = `${pathToFileURL(distRoot).href}/`;
    return child.stderr
      .split("\n")
      .filter((line) => line.startsWith(`loaded ${prefix}`))
      .map((line) => line.slice(`loaded ${prefix}`.length));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

it("loading the API schemas loads no engine module (controller, vmm, store, image, net, isolation)", async () => {
  const loaded = await modulesLoadedBy("src/api/schemas.js");
  assert.ok(loaded.includes("src/api/schemas.js"), `the hook saw the schemas load: ${loaded.join(", ")}`);
  assert.ok(loaded.includes("src/common/limits.js"), "the limits come from the table");
  assert.deepEqual(
    loaded.filter((m) => ENGINE.test(`/${m}`)),
    [],
    "engine modules loaded by src/api/schemas.js",
  );
});
