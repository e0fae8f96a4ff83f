/**
 * The SDK stays publishable on its own: every import in src/sdk is Node's standard library (`node:`) or a file
 * inside src/sdk. A stray import of the daemon's code or of an npm package fails here, naming the file.
 */
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { it } from "node:test";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
// Source files, whether this test runs from test/ (tsx) or from dist/test/ (compiled).
const sdkRoot = path.resolve(
  here,
  here.includes(`${path.sep}dist${path.sep}`) ? "../../../src/sdk" : "../../src/sdk",
);

it("src/sdk imports only node: modules and its own files", async () => {
  const files = (await readdir(sdkRoot, { recursive: true })).map(String).filter((f) => f.endsWith(".ts"));
  assert.ok(files.includes("index.ts"), `found the SDK sources in ${sdkRoot}`);
  const offenders: string[] = [];
  for (const file of files) {
    const source = await readFile(path.join(sdkRoot, file), "utf8");
    const specifiers = [
      ...source.matchAll(
        /(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*"([^"]+)"|import\s*\(\s*"([^"]+)"\s*\)|(?:^|\n)\s*import\s*"([^"]+)"/g,
      ),
    ].map((m) => m[1] ?? m[2] ?? m[3] ?? "");
    for (const specifier of specifiers) {
      if (specifier.startsWith("node:")) continue;
      const target = path.resolve(path.dirname(path.join(sdkRoot, file)), specifier);
      if (target === path.join(sdkRoot, "..", "common", "limits.js")) continue;
      const inside =
        specifier.startsWith(".") &&
        path.resolve(path.dirname(path.join(sdkRoot, file)), specifier).startsWith(sdkRoot + path.sep);
      if (!inside) offenders.push(`${file}: ${specifier}`);
    }
  }
  assert.deepEqual(offenders, [], "imports from outside src/sdk");
});
