/**
 * bench/chain-spawn — spawning from diff-snapshot chains. L0 is the 512 MiB pyagent snapshot; L1..L3 are
 * snapshot-diff layers that each install a generated Python package of realistic size (modules written,
 * byte-compiled and imported once, so disk and page cache change); FLAT is L3 compacted. For each: build time,
 * spawn latency p50/p99 (n=1 requests, after the first spawn assembled and cached the chain's RAM image, which
 * is reported apart), bytes on disk per layer against what the layer changed.
 *
 *   npm run bench -- chain-spawn   (env: BENCH_SPAWNS=10, BENCH_TAG=pyagent, BENCH_PKG_MODULES=150)
 */
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { openServices } from "../src/controller/sandboxes/manager.js";
import { chainDetail, compactSnapshot } from "../src/controller/snapshots/chains.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const SPAWNS = envNumber("BENCH_SPAWNS", 10);
const BASE = process.env.BENCH_TAG ?? "pyagent";
const MODULES = envNumber("BENCH_PKG_MODULES", 150);
const LAYERS = [`${BASE}-l1`, `${BASE}-l2`, `${BASE}-l3`];
const FLAT = `${BASE}-l3-flat`;

/** A shell command that writes package `name` (MODULES modules of ~8 KiB each), byte-compiles and imports it. */
function installPackage(name: string): string {
  const script = [
    "import os, site, sys",
    // The first site directory is on sys.path (Debian: /usr/local/lib/python3.X/dist-packages).
    `root = os.path.join(site.getsitepackages()[0], '${name}')`,
    "os.makedirs(root, exist_ok=True)",
    "open(os.path.join(root, '__init__.py'), 'w').write('')",
    `for i in range(${MODULES}):`,
    "    body = ''.join(f'def f{j}(x):\\n    return x * {j} + {i}\\n\\n' for j in range(200))",
    "    open(os.path.join(root, f'm{i}.py'), 'w').write(body)",
    "import compileall; compileall.compile_dir(root, quiet=1)",
    `import importlib; [importlib.import_module(f'${name}.m{i}') for i in range(${MODULES})]`,
  ].join("\n");
  return `python3 - <<'EOF'\n${script}\nEOF`;
}

const paths = resolvePaths();
const services = await openServices(paths, { limits: { maxConcurrentSpawns: 8 } });
const made: string[] = [];
try {
  const buildMs = new Map<string, number>();
  let parent = BASE;
  for (const [i, tag] of LAYERS.entries()) {
    await services.snapshots.delete(tag).catch(() => {});
    const started = performance.now();
    await services.sandboxes.snapshotDiff({
      from: parent,
      tag,
      command: ["/bin/sh", "-c", installPackage(`benchpkg${i + 1}`)],
    });
    buildMs.set(tag, performance.now() - started);
    made.push(tag);
    parent = tag;
  }
  await services.snapshots.delete(FLAT).catch(() => {});
  const started = performance.now();
  await compactSnapshot(paths, { from: LAYERS[2] as string, to: FLAT });
  buildMs.set(FLAT, performance.now() - started);
  made.push(FLAT);

  const spawnOnce = async (tag: string) => {
    const t = performance.now();
    const [sb] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
    const ms = performance.now() - t;
    await services.sandboxes.kill((sb as { id: string }).id);
    return ms;
  };
  const rows: Row[] = [];
  const json: Record<string, unknown> = {
    host: hostDescription(),
    spawns: SPAWNS,
    modules_per_layer: MODULES,
  };
  const p50s = new Map<string, number>();
  for (const tag of [BASE, ...LAYERS, FLAT]) {
    const first = await spawnOnce(tag);
    const times: number[] = [];
    for (let i = 0; i < SPAWNS; i++) times.push(await spawnOnce(tag));
    const detail = await chainDetail(paths, tag);
    const own = detail.layers[detail.layers.length - 1];
    const memBytes = own?.memory.physical_bytes ?? 0;
    const diskBytes = own?.disk.physical_bytes ?? 0;
    const changedBytes = (own?.memory.pages ?? 0) * 4096;
    p50s.set(tag, percentile(times, 50));
    rows.push({
      metric: `${tag} (depth ${detail.chain_depth}): spawn p50 / p99`,
      value: `${percentile(times, 50).toFixed(0)} / ${percentile(times, 99).toFixed(0)} ms`,
      note: `first spawn ${first.toFixed(0)} ms${buildMs.has(tag) ? `; built in ${((buildMs.get(tag) ?? 0) / 1000).toFixed(1)} s` : ""}`,
    });
    if (own?.memory.format === "layer") {
      rows.push({
        metric: `${tag}: memory layer on disk vs pages changed`,
        value: `${(memBytes / 2 ** 20).toFixed(1)} / ${(changedBytes / 2 ** 20).toFixed(1)} MiB`,
        target: "within 10%",
        note: `disk layer ${(diskBytes / 2 ** 20).toFixed(1)} MiB`,
      });
    }
    json[tag] = {
      depth: detail.chain_depth,
      spawn_ms: { first, p50: percentile(times, 50), p99: percentile(times, 99), samples: times },
      build_ms: buildMs.get(tag) ?? null,
      memory_physical_bytes: memBytes,
      memory_changed_bytes: changedBytes,
      disk_physical_bytes: diskBytes,
    };
  }
  const flat = p50s.get(FLAT) ?? Number.NaN;
  const depth3 = p50s.get(LAYERS[2] as string) ?? Number.NaN;
  const base = p50s.get(BASE) ?? Number.NaN;
  const perLink = (depth3 - flat) / 3;
  rows.push({
    metric: "per-link spawn tax ((depth 3 - flat) / 3)",
    value: `${perLink.toFixed(1)} ms`,
    target: "< 5 ms",
  });
  rows.push({ metric: "depth 3 vs flat (p50)", value: `${(depth3 / flat).toFixed(2)}x`, target: "<= 1.2x" });
  rows.push({ metric: "flat (compacted) vs L0 (p50)", value: `${(flat / base).toFixed(2)}x` });
  json.per_link_tax_ms = perLink;
  json.depth3_vs_flat = depth3 / flat;
  json.accelerator = (await services.snapshots.get(BASE)).accelerator;
  json.measured_at = new Date().toISOString();
  printRows(`bench/chain-spawn on ${hostDescription()}`, rows);
  await writeResults(
    "chain-spawn",
    json,
    `# bench/chain-spawn\n\n${json.measured_at} on ${json.host}; ${json.accelerator}\n\n${markdownTable(rows)}`,
  );
} finally {
  await services.sandboxes.killAll();
  for (const tag of made.reverse()) await services.snapshots.delete(tag).catch(() => {});
  await services.close();
}
