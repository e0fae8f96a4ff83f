/**
 * The MCP server is a client like any other: src/mcp imports Node, the MCP SDK, zod, its own files and the
 * TypeScript SDK's public entry (src/sdk/index.ts), never the daemon's layers. A stray import fails here, naming it.
 */
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { it } from "node:test";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const srcRoot = path.resolve(
  here,
  here.includes(`${path.sep}dist${path.sep}`) ? "../../../src" : "../../src",
);
const mcpRoot = path.join(srcRoot, "mcp");
const SDK_ENTRY = path.join(srcRoot, "sdk", "index.js");
const LIMITS = path.join(srcRoot, "common", "limits.js");

it("src/mcp reaches the daemon only through the TypeScript SDK", async () => {
  const files = (await readdir(mcpRoot)).filter((f) => f.endsWith(".ts"));
  assert.ok(files.includes("server.ts"), `found the MCP sources in ${mcpRoot}`);
  const offenders: string[] = [];
  for (const file of files) {
    const source = await readFile(path.join(mcpRoot, file), "utf8");
    for (const match of source.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*"([^"]+)"/g)) {
      const specifier = match[1] ?? "";
      if (specifier.startsWith("node:") || specifier === "zod") continue;
      if (specifier.startsWith("@modelcontextprotocol/sdk/")) continue;
      const resolved = specifier.startsWith(".") ? path.resolve(mcpRoot, specifier) : "";
      if (resolved.startsWith(mcpRoot + path.sep) || resolved === SDK_ENTRY || resolved === LIMITS) continue;
      offenders.push(`${file}: ${specifier}`);
    }
  }
  assert.deepEqual(offenders, [], "imports that bypass the SDK");
});
