#!/usr/bin/env node
// `npm run bench -- <name> [args]`: runs the compiled benchmark bench/<name>.ts (see bench/README.md).
import { existsSync, readdirSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";

const benchDir = fileURLToPath(new URL("../dist/bench/", import.meta.url));
const name = process.argv[2];
const available = existsSync(benchDir)
  ? readdirSync(benchDir)
      .filter((f) => f.endsWith(".js") && !f.startsWith("lib"))
      .map((f) => f.slice(0, -3))
  : [];
if (!name || !available.includes(name)) {
  console.error(`usage: npm run bench -- <${available.join("|") || "name"}> (run npm run build first)`);
  process.exit(2);
}
process.argv.splice(2, 1);
await import(pathToFileURL(`${benchDir}${name}.js`).href);
