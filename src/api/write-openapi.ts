/**
 * `npm run openapi`: regenerates docs/openapi.json (the forkd API) and docs/e2b-openapi.json (the E2B API) from
 * the route schemas (atomically: temp file, then rename). With --check, only compares and exits 1 when a
 * checked-in document is stale.
 */
import { readFile, rename, writeFile } from "node:fs/promises";
import { checkedInOpenApiPath, renderOpenApi } from "./openapi.js";

const rendered = await renderOpenApi();
const documents = [
  { target: checkedInOpenApiPath("openapi.json"), text: rendered.forkd },
  { target: checkedInOpenApiPath("e2b-openapi.json"), text: rendered.e2b },
];
let stale = false;
for (const { target, text } of documents) {
  if (process.argv.includes("--check")) {
    const current = await readFile(target, "utf8").catch(() => "");
    if (current !== text) {
      process.stderr.write(`${target} is stale: run \`npm run openapi\`\n`);
      stale = true;
    } else process.stdout.write(`${target} is up to date\n`);
  } else {
    const temp = `${target}.tmp-${process.pid}`;
    await writeFile(temp, text);
    await rename(temp, target);
    process.stdout.write(`wrote ${target}\n`);
  }
}
if (stale) process.exit(1);
