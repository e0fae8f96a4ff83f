/**
 * bench/templates — the recipes in templates/: for each, the image build cold (no image and no build step
 * cached; the kernel and initramfs, which every template shares, are), the same build again (image cached),
 * the image made again from cached steps (the last step's layers unpacked), the recipe plus one step, the image and
 * step-cache sizes, and the snapshot (boot, start/ready, warm-up) with its size on disk. Then the postgres
 * recipe's point, side by side in one run: a child forked from the snapshot answering its first query, against
 * a fresh VM booting PostgreSQL (start, pg_isready) and answering the same query, interleaved round by round.
 *
 *   npm run bench -- templates   (env: BENCH_RECIPES=postgres,python-data,..., BENCH_ROUNDS=5, BENCH_BATCH=8)
 *
 * Uses its own FORKD_HOME and one image cache per recipe under BENCH_DIR (default /var/tmp/forkd-bench-templates,
 * emptied first), so "cold" is cold; the oci-archive and dockerfile recipes get the busybox image their tests make.
 */
import { execFile } from "node:child_process";
import { cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { chooseAccelerator } from "../src/controller/machines/accelerator.js";
import { coldBootExec } from "../src/controller/machines/cold-boot.js";
import { forkChildren } from "../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { buildImage, loadTemplate, type Template } from "../src/image/index.js";
import { builtinTemplatesDir } from "../src/image/package-root.js";
import { RECIPE_TEMPLATE_FILE } from "../src/image/template.js";
import { SnapshotStore } from "../src/store/snapshot-store.js";
import { makeBusyboxLayout, saveArchive } from "../test/image/oci-fixtures.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const execFileAsync = promisify(execFile);
const RECIPES = (
  process.env.BENCH_RECIPES ?? "postgres,python-data,node,coding-agent,oci-archive,dockerfile"
).split(",");
const ROUNDS = envNumber("BENCH_ROUNDS", 5);
const BATCH = envNumber("BENCH_BATCH", 8);
const ROOT = process.env.BENCH_DIR ?? "/var/tmp/forkd-bench-templates";
const QUERY = ["psql", "-Atc", "select 6 * 7"];

const loadAverage = () => os.loadavg().map((l) => Number(l.toFixed(2)));
const loadStart = loadAverage();
const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

/** Bytes a path takes on disk (sparse files count what is allocated). */
async function diskBytes(target: string): Promise<number> {
  const { stdout } = await execFileAsync("du", ["-s", "-B1", target]);
  return Number(stdout.split("\t")[0]);
}

/** A copy of a recipe's directory in `scratch` (oci-archive and dockerfile with the busybox archive they need). */
async function recipeCopy(name: string, scratch: string): Promise<string> {
  const dir = path.join(scratch, name);
  await cp(path.join(builtinTemplatesDir(), name), dir, { recursive: true });
  if (name === "oci-archive" || name === "dockerfile") {
    const layout = await makeBusyboxLayout(await mkdtemp(path.join(scratch, "busybox-")));
    await saveArchive(
      layout,
      "oci-archive",
      path.join(dir, name === "oci-archive" ? "image.tar" : "base.tar"),
    );
  }
  return path.join(dir, RECIPE_TEMPLATE_FILE);
}

/** The recipe with one more step at the end: everything before it is cached, so only that step runs. */
async function withExtraStep(templateFile: string): Promise<Template> {
  const file = path.join(path.dirname(templateFile), "template-plus-one.toml");
  const text = await readFile(templateFile, "utf8");
  await writeFile(
    file,
    // The step's user may have no home yet (coding-agent's uid 1000 gets its passwd entry after the steps,
    // so $HOME is "/"): the first of its home, its working directory and /tmp it can write to.
    `${text}\n[[steps]]\nrun = 'for d in "$HOME" "$PWD" /tmp; do echo one more step > "$d/bench-extra-step.txt" 2>/dev/null && break; done'\n`,
  );
  return loadTemplate(file, { allowFiles: true });
}

await rm(ROOT, { recursive: true, force: true });
const scratch = path.join(ROOT, "scratch");
await mkdir(scratch, { recursive: true });
process.env.FORKD_HOME = path.join(ROOT, "home");
// The kernel and initramfs are the same for every template: made once (with the minimal template), then
// given to each recipe's own, otherwise empty, image cache.
const bootOnly = path.join(ROOT, "boot-only");
await buildImage(await loadTemplate("minimal"), { cacheDir: path.join(ROOT, "images-minimal") });
await mkdir(bootOnly, { recursive: true });
await cp(path.join(ROOT, "images-minimal", ".boot"), path.join(bootOnly, ".boot"), { recursive: true });
await cp(
  path.join(ROOT, "images-minimal", ".apt-resolution.json"),
  path.join(bootOnly, ".apt-resolution.json"),
);

/** Each recipe's image cache (its snapshot's image stays there). */
const cacheOf = (recipe: string) => path.join(ROOT, `images-${recipe}`);
const pathsFor = (recipe: string) => {
  process.env.FORKD_IMAGE_CACHE = cacheOf(recipe);
  return resolvePaths();
};
let accel = "";

interface RecipeResult {
  recipe: string;
  steps: number;
  cold_build_s: number;
  cached_build_s: number;
  rebuild_on_cached_steps_s: number;
  /** The recipe plus one step at the end: only that step runs (its chain cached), then the image. */
  one_more_step_s: number;
  step_seconds: { number: number; description: string; seconds: number }[];
  image_used_mib: number;
  rootfs_disk_bytes: number;
  step_cache_bytes: number;
  snapshot: {
    boot_ms: number;
    start_to_ready_ms: number;
    warmup_ms: number;
    total_s: number;
    disk_bytes: number;
    memory_mib: number;
  };
}

// --- postgres: a forked child's first query vs a fresh boot of PostgreSQL, interleaved ---
let postgres: Record<string, unknown> | undefined;
async function comparePostgres(): Promise<void> {
  const paths = pathsFor("postgres");
  const template = await loadTemplate("postgres");
  const image = await buildImage(template, { cacheDir: cacheOf("postgres") });
  const accelerator = await chooseAccelerator(paths, image);
  const forked: number[] = [];
  const fresh: number[] = [];
  const freshReady: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const fork = await forkChildren(paths, { tag: "bench-postgres", n: 1, exec: QUERY });
    const child = fork.children[0];
    if (child?.stdout.trim() !== "42")
      throw new Error(`forked child answered ${child?.stdout} ${child?.error}`);
    forked.push(child.done_ms);
    const boot = await coldBootExec(paths, { template, image, accel: accelerator, exec: QUERY });
    if (boot.stdout.trim() !== "42") throw new Error(`fresh boot answered ${boot.stdout} ${boot.error}`);
    fresh.push(boot.totalMs);
    freshReady.push(boot.readyMs);
    console.log(
      `round ${round + 1}: fork ${forked[round]?.toFixed(0)} ms, fresh boot ${boot.totalMs.toFixed(0)} ms`,
    );
  }
  const batchStarted = performance.now();
  const batch = await forkChildren(paths, { tag: "bench-postgres", n: BATCH, exec: QUERY });
  const batchMs = performance.now() - batchStarted;
  const batchOk = batch.children.filter((c) => c.stdout.trim() === "42").length;
  postgres = {
    rounds: ROUNDS,
    forked_first_query_ms: forked,
    fresh_boot_first_query_ms: fresh,
    fresh_boot_start_to_ready_ms: freshReady,
    forked_p50_ms: percentile(forked, 50),
    fresh_p50_ms: percentile(fresh, 50),
    speedup_p50: percentile(fresh, 50) / percentile(forked, 50),
    batch: { n: BATCH, ok: batchOk, wall_ms: batchMs },
    load_average_after: loadAverage(),
  };
}

const results: RecipeResult[] = [];
for (const name of RECIPES) {
  // A cache with only the shared boot parts: nothing of this recipe is cached.
  const cacheDir = cacheOf(name);
  await cp(bootOnly, cacheDir, { recursive: true });
  const paths = pathsFor(name);
  const templateFile = await recipeCopy(name, scratch);
  const template = await loadTemplate(templateFile, { allowFiles: true });
  // Written before the cold build: a Dockerfile's context is the recipe's directory, so a file added later
  // would change the context hash and rebuild the Dockerfile too.
  const templatePlusOne = await withExtraStep(templateFile);
  console.log(`\n== ${name}: cold build`);
  let started = performance.now();
  const cold = await buildImage(template, { cacheDir });
  const coldMs = performance.now() - started;
  started = performance.now();
  await buildImage(template, { cacheDir });
  const cachedMs = performance.now() - started;
  // The image removed, its steps kept: the image is made again from the last step's cached layers.
  await rm(cold.dir, { recursive: true, force: true });
  started = performance.now();
  const forced = await buildImage(template, { cacheDir });
  const forcedMs = performance.now() - started;
  if (!forced.steps?.every((s) => s.cached)) throw new Error(`${name}: re-making the image re-ran a step`);
  started = performance.now();
  const plusOne = await buildImage(templatePlusOne, { cacheDir });
  const plusOneMs = performance.now() - started;
  const rerun = plusOne.steps?.filter((s) => !s.cached).map((s) => s.number) ?? [];
  if (rerun.length !== 1 || rerun[0] !== template.steps.length + 1) {
    throw new Error(`${name}: one more step re-ran steps ${rerun.join(", ")}`);
  }
  const stepsDir = path.join(cacheDir, ".steps");
  const stepCache = (await readdir(stepsDir).catch(() => [])).length > 0 ? await diskBytes(stepsDir) : 0;

  console.log(`== ${name}: snapshot`);
  const tag = `bench-${name}`;
  started = performance.now();
  // start/ready from the progress events' times (the manifest records boot and warm-up only).
  const marks = new Map<string, number>();
  const snap = await createSnapshot(paths, {
    tag,
    template: template.source,
    templateFiles: true,
    replace: true,
    onProgress: (e) => {
      if (!marks.has(e.step)) marks.set(e.step, performance.now());
      marks.set(`${e.step}:last`, performance.now());
    },
  });
  const snapMs = performance.now() - started;
  const span = (step: string) =>
    marks.has(step) ? (marks.get(`${step}:last`) as number) - (marks.get(step) as number) : 0;
  const dir = new SnapshotStore(paths.snapshots).dirOf(tag);
  accel = snap.manifest.machine.accel;
  results.push({
    recipe: name,
    steps: template.steps.length,
    cold_build_s: coldMs / 1000,
    cached_build_s: cachedMs / 1000,
    rebuild_on_cached_steps_s: forcedMs / 1000,
    one_more_step_s: plusOneMs / 1000,
    step_seconds: (cold.steps ?? []).map((s) => ({
      number: s.number,
      description: s.description,
      seconds: s.seconds,
    })),
    image_used_mib: cold.manifest.rootfs.usedMib,
    rootfs_disk_bytes: await diskBytes(forced.rootfs),
    step_cache_bytes: stepCache,
    snapshot: {
      boot_ms: snap.manifest.timings.bootMs,
      start_to_ready_ms: Math.round(span("ready")),
      warmup_ms: snap.manifest.timings.warmupMs,
      total_s: snapMs / 1000,
      disk_bytes: await diskBytes(dir),
      memory_mib: snap.manifest.machine.memoryMiB,
    },
  });
  console.log(JSON.stringify(results[results.length - 1]));
  // The side-by-side comparison right after its snapshot, so an interrupted run still has it.
  if (name === "postgres") await comparePostgres();
  await report(false);
}

async function report(complete: boolean): Promise<void> {
  const rows: Row[] = [];
  for (const r of results) {
    rows.push({
      metric: `${r.recipe}: build cold / cached / image again from cached steps / one more step`,
      value: `${seconds(r.cold_build_s * 1000)} / ${seconds(r.cached_build_s * 1000)} / ${seconds(r.rebuild_on_cached_steps_s * 1000)} / ${seconds(r.one_more_step_s * 1000)}`,
      note: `${r.steps} steps; slowest: ${[...r.step_seconds].sort((a, b) => b.seconds - a.seconds)[0]?.description ?? "-"}`,
    });
    rows.push({
      metric: `${r.recipe}: image files / rootfs on disk / step cache`,
      value: `${r.image_used_mib} MiB / ${mib(r.rootfs_disk_bytes)} / ${mib(r.step_cache_bytes)}`,
    });
    rows.push({
      metric: `${r.recipe}: snapshot total (boot, start to ready, warm-up) / on disk`,
      value: `${seconds(r.snapshot.total_s * 1000)} (${seconds(r.snapshot.boot_ms)}, ${seconds(r.snapshot.start_to_ready_ms)}, ${seconds(r.snapshot.warmup_ms)}) / ${mib(r.snapshot.disk_bytes)}`,
      note: `${r.snapshot.memory_mib} MiB guest`,
    });
  }
  if (postgres) {
    rows.push({
      metric: "postgres: forked child to first query answer, p50",
      value: `${(postgres.forked_p50_ms as number).toFixed(0)} ms`,
      note: `${ROUNDS} rounds, one child each`,
    });
    rows.push({
      metric: "postgres: fresh boot + start + pg_isready + first query, p50",
      value: `${(postgres.fresh_p50_ms as number).toFixed(0)} ms`,
      note: "same image and query, interleaved with the forks",
    });
    rows.push({
      metric: "postgres: fork speed-up (p50)",
      value: `${(postgres.speedup_p50 as number).toFixed(1)}x`,
    });
    const batch = postgres.batch as { n: number; ok: number; wall_ms: number };
    rows.push({
      metric: `postgres: ${batch.n} children at once, all answered`,
      value: `${seconds(batch.wall_ms)}`,
      note: `${batch.ok}/${batch.n} correct`,
    });
  }

  const host = hostDescription();
  const accelNote = `accelerator: ${accel}`;
  if (complete) printRows(`bench/templates (${host}; ${accelNote})`, rows);
  await writeResults(
    "templates",
    {
      host,
      accel: accelNote,
      date: new Date().toISOString(),
      complete,
      recipes_asked: RECIPES,
      load_average_start: loadStart,
      load_average_end: loadAverage(),
      recipes: results,
      postgres,
    },
    `# bench/templates\n\n${host}; ${accelNote}; ${new Date().toISOString().slice(0, 10)}; load average (1/5/15 min) ${loadStart.join(" / ")} at the start, ${loadAverage().join(" / ")} at the end (other VMs shared the 2 cores)${complete ? "" : `; INCOMPLETE: ${results.map((r) => r.recipe).join(", ")} of ${RECIPES.join(", ")} done`}\n\n${markdownTable(rows)}\n\n` +
      "Cold: no image and no step of the recipe cached (the kernel/initramfs, shared by all templates, cached). " +
      "Cached: the same build again (the image is found by its recipe hash). Image again from cached steps: the image " +
      "removed, every step cached (umoci unpack of the last step, the agent payload, mkfs). One more step: the recipe " +
      "with a `run` step appended (only it runs, then the image). Rootfs on disk: the sparse " +
      "ext4's allocated bytes. Snapshot on disk: memory.bin (allocated), device state and the parent's disk layer.\n",
  );
}

await report(true);
await rm(scratch, { recursive: true, force: true });
