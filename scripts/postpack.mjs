#!/usr/bin/env node
/** After `npm pack`: removes the npm-shrinkwrap.json scripts/prepack.mjs copied from package-lock.json. */
import { readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const shrinkwrap = path.join(root, "npm-shrinkwrap.json");
let copy;
try {
  copy = readFileSync(shrinkwrap, "utf8");
} catch {
  process.exit(0);
}
// Only the copy prepack made: a shrinkwrap someone wrote by hand stays.
if (copy === readFileSync(path.join(root, "package-lock.json"), "utf8")) rmSync(shrinkwrap);
