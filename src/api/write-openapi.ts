/**
 * `npm run openapi`: regenerates docs/openapi.json from the route schemas (atomically: temp file, then rename).
 * With --check, only compares and exits 1 when the checked-in document is stale.
 */
import { readFile, rename, writeFile } from "node:fs/promises";
import { checkedInOpenApiPath, renderOpenApi } from "./openapi.js";

const target = checkedInOpenApiPath();
const rendered = await renderOpenApi();
if (process.argv.includes("--check")) {
  const current = await readFile(target, "utf8").catch(() => "");
  if (current !== rendered) {
    process.stderr.write(`${target} is stale: run \`npm run openapi\`\n`);
    process.exit(1);
  }
  process.stdout.write(`${target} is up to date\n`);
} else {
  const temp = `${target}.tmp-${process.pid}`;
  await writeFile(temp, rendered);
  await rename(temp, target);
  process.stdout.write(`wrote ${target}\n`);
}
