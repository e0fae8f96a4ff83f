/** Shared output of the benchmarks: a printed table plus JSON and markdown files under bench/results/. */
import { mkdir, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { resolvePaths } from "../../src/common/paths.js";
import { procStatFields } from "../../src/controller/host/processes.js";
import type { SnapshotManifest } from "../../src/store/manifest.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { qemuVersion } from "../../src/vmm/qemu-tools.js";

export const RESULTS_DIR = path.resolve(
  fileURLToPath(new URL(".", import.meta.url)),
  "../../../bench/results",
);

export interface Row {
  metric: string;
  value: string;
  target?: string;
  note?: string;
}

export function hostDescription(): string {
  const cpu = os.cpus()[0]?.model ?? "unknown cpu";
  return `${os.cpus().length} x ${cpu}, ${(os.totalmem() / 1024 ** 3).toFixed(0)} GiB, Linux ${os.release()}`;
}

/** What every result records of the machine its guests ran on (a benchmark's numbers mean little without it). */
export interface BenchConditions {
  accelerator: string;
  /** The guest CPU model (`-cpu`) of the snapshot the children came from. */
  cpu_model: string;
  /** The QEMU that ran the children (FORKD_QEMU_BINARY or the one on PATH). */
  qemu_version: string;
  /** The QEMU the snapshot's parent ran on. */
  snapshot_qemu_version: string;
}

export async function benchConditions(manifest: SnapshotManifest | undefined): Promise<BenchConditions> {
  return {
    accelerator: manifest?.machine.accel ?? "unknown",
    cpu_model: manifest?.machine.cpu ?? "unknown",
    qemu_version: (await qemuVersion()).version,
    snapshot_qemu_version: manifest?.machine.qemuVersion ?? "unknown",
  };
}

function found(record: Record<string, unknown>): BenchConditions {
  const text = (key: keyof BenchConditions) => String(record[key] ?? "unknown");
  return {
    accelerator: text("accelerator"),
    cpu_model: text("cpu_model"),
    qemu_version: text("qemu_version"),
    snapshot_qemu_version: text("snapshot_qemu_version"),
  };
}

/** One line for a results file's header: accelerator, CPU model and QEMU version. */
export function conditionsLine(c: BenchConditions): string {
  return `${c.accelerator}, -cpu ${c.cpu_model}, QEMU ${c.qemu_version}`;
}

export function markdownTable(rows: Row[]): string {
  const lines = ["| metric | value | target | note |", "|---|---|---|---|"];
  for (const r of rows) lines.push(`| ${r.metric} | ${r.value} | ${r.target ?? ""} | ${r.note ?? ""} |`);
  return lines.join("\n");
}

export function printRows(title: string, rows: Row[]): void {
  const w = Math.max(...rows.map((r) => r.metric.length));
  const v = Math.max(...rows.map((r) => r.value.length));
  console.log(`\n${title}`);
  for (const r of rows) {
    console.log(
      `  ${r.metric.padEnd(w)}  ${r.value.padStart(v)}  ${r.target ? `(target ${r.target})` : ""} ${r.note ?? ""}`,
    );
  }
}

/**
 * Writes `<name>.json` and `<name>.md`. Every result records the machine its guests ran on: a result that does
 * not say it itself (accelerator, cpu_model, qemu_version) gets them from the snapshot it names (`tag`,
 * else BENCH_TAG, else pyagent) in FORKD_HOME (or `home`), and the markdown gets a line saying them.
 */
export async function writeResults(
  name: string,
  json: unknown,
  markdown: string,
  /** The forkd home holding that snapshot, when it is not FORKD_HOME (a local cluster's seed home). */
  home?: string,
): Promise<void> {
  const record = json as Record<string, unknown>;
  let conditions: Partial<BenchConditions> = {};
  if (record.cpu_model === undefined || record.qemu_version === undefined) {
    const tag = typeof record.tag === "string" ? record.tag : (process.env.BENCH_TAG ?? "pyagent");
    const paths = resolvePaths(home === undefined ? process.env : { ...process.env, FORKD_HOME: home });
    const manifest = await new SnapshotStore(paths.snapshots)
      .get(tag)
      .then((s) => s.manifest)
      .catch(() => undefined);
    const found = await benchConditions(manifest);
    conditions = Object.fromEntries(Object.entries(found).filter(([key]) => record[key] === undefined));
  }
  const full = { ...conditions, ...record };
  const line =
    Object.keys(conditions).length > 0
      ? `\n\nMachine: ${conditionsLine({ ...found(full) })}; snapshot's QEMU ${String(full.snapshot_qemu_version ?? "unknown")}`
      : "";
  await mkdir(RESULTS_DIR, { recursive: true });
  await writeFile(path.join(RESULTS_DIR, `${name}.json`), `${JSON.stringify(full, null, 2)}\n`);
  await writeFile(path.join(RESULTS_DIR, `${name}.md`), `${markdown}${line}\n`);
  console.log(`\nwrote ${path.join(RESULTS_DIR, `${name}.json`)} and ${name}.md`);
}

/** Proportional set size of a process in KiB (shared pages divided among the processes mapping them). */
export async function pssKiB(pid: number): Promise<number> {
  const { readFile } = await import("node:fs/promises");
  const text = await readFile(`/proc/${pid}/smaps_rollup`, "utf8");
  return Number(/^Pss:\s+(\d+) kB/m.exec(text)?.[1] ?? Number.NaN);
}

export async function memAvailableKiB(): Promise<number> {
  const { readFile } = await import("node:fs/promises");
  const text = await readFile("/proc/meminfo", "utf8");
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(text)?.[1] ?? Number.NaN);
}

/** CPU time (user + system: stat fields 14 and 15) a process has used, in milliseconds; NaN once it is gone. */
export async function cpuMs(pid: number): Promise<number> {
  const { execFileSync } = await import("node:child_process");
  const fields = await procStatFields(pid);
  clockTicks ??= Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
  return fields ? ((Number(fields[11]) + Number(fields[12])) * 1000) / clockTicks : Number.NaN;
}
let clockTicks: number | undefined;

/** Host CPU the processes use per second each, sampled over `windowMs` while they sit idle. */
export async function idleCpuMsPerSecond(pids: number[], windowMs: number): Promise<number> {
  const before = await Promise.all(pids.map(cpuMs));
  await new Promise((resolve) => setTimeout(resolve, windowMs));
  const after = await Promise.all(pids.map(cpuMs));
  const used = after.reduce((sum, ms, i) => sum + ms - (before[i] ?? 0), 0);
  return used / pids.length / (windowMs / 1000);
}
