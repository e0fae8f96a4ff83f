#!/usr/bin/env node
/**
 * Builds the e2b-python recipe through E2B's template API with E2B's SDK, as on E2B's cloud:
 *
 *   export E2B_API_URL=http://127.0.0.1:8889 E2B_SANDBOX_URL=http://127.0.0.1:8889 E2B_API_KEY=<a daemon token>
 *   node templates/e2b-python/build.mjs <base image reference> [name[:tag]]
 *
 * Prints the build's log as it comes and, at the end, `built <name> template <id> build <id>`; exits 1 with the
 * failing step's error.
 */
import { Template } from "e2b";
import { e2bPythonTemplate } from "./template.mjs";

const [baseImage, name = "e2b-python"] = process.argv.slice(2);
if (!baseImage) {
  console.error("usage: build.mjs <base image reference> [name[:tag]]");
  process.exit(64);
}
try {
  const info = await Template.build(e2bPythonTemplate(baseImage), name, {
    memoryMB: 512,
    onBuildLogs: (entry) => console.log(entry.message),
  });
  console.log(`built ${info.name} template ${info.templateId} build ${info.buildId}`);
} catch (err) {
  console.error(`build failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
}
