/**
 * npm run deploy:write: writes the generated deployment files — the chart's CRDs (deploy/helm/forkd/crds/,
 * from src/cluster) and then the kustomize base (deploy/kustomize/base/, the chart rendered with its default
 * values). test/cluster/deploy-files.test.ts fails when a committed file differs from what this writes.
 * Needs the Kubernetes tools (scripts/k8s-tools.sh).
 */
import { mkdir, readdir, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import {
  CHART_DIR,
  expectedCrdFiles,
  expectedKustomizeFiles,
  KUSTOMIZE_BASE,
  renderChartText,
} from "../test/support/deploy-files.js";
import { kubeTools } from "../test/support/kube-tools.js";

/** Replaces `dir`'s generated files with `files` (each written atomically). */
async function writeAll(dir: string, files: Map<string, string>, stale: (name: string) => boolean) {
  await mkdir(dir, { recursive: true });
  for (const name of await readdir(dir)) {
    if (stale(name) && !files.has(name)) await rm(path.join(dir, name));
  }
  for (const [name, text] of files) {
    const target = path.join(dir, name);
    await writeFile(`${target}.tmp`, text);
    await rename(`${target}.tmp`, target);
    process.stdout.write(`wrote ${path.relative(process.cwd(), target)}\n`);
  }
}

const crds = new Map([...expectedCrdFiles()].map(([name, text]) => [path.basename(name), text]));
await writeAll(path.join(CHART_DIR, "crds"), crds, (name) => name.endsWith(".yaml"));
const chart = await renderChartText(await kubeTools());
await writeAll(KUSTOMIZE_BASE, expectedKustomizeFiles(chart), (name) => name.endsWith(".yaml"));
