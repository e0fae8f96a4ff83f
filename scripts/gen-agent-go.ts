/**
 * npm run gen:agent: writes src/agent/guest/protocol/protocol_gen.go from the TypeBox declaration in
 * src/agent/protocol (gofmt'd). `--check` exits 1 when the committed file differs.
 */
import { execFileSync } from "node:child_process";
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { generateGo } from "../src/agent/protocol/gen-go.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const target = path.join(root, "src/agent/guest/protocol/protocol_gen.go");
const source = execFileSync("gofmt", [], { input: generateGo(), encoding: "utf8" });
if (process.argv.includes("--check")) {
  const committed = readFileSync(target, "utf8");
  if (committed !== source) {
    console.error(`${path.relative(root, target)} is stale: run npm run gen:agent`);
    process.exit(1);
  }
} else {
  writeFileSync(`${target}.tmp`, source);
  renameSync(`${target}.tmp`, target);
  console.log(`wrote ${path.relative(root, target)}`);
}
