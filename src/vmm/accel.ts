/**
 * Which accelerator can run guests on this host, decided by booting a probe guest (never by the mere
 * existence of /dev/kvm: a PVM host has a working /dev/kvm on which stock kernels hang after "Probing EDD").
 *
 * The probe initramfs's /init prints PROBE_MARKER on ttyS0 and powers off. The verdict is cached per host
 * boot, QEMU version and kernel, so CLI commands do not pay for a probe every time.
 */
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { abortError, sleep } from "../common/deadline.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { resolvePaths } from "../common/paths.js";
import { detectHostTsc } from "./host-tsc.js";
import { launchVm, type VmHandle } from "./launch.js";
import type { Accelerator, MachineSpec } from "./qemu-args.js";
import { qemuVersion } from "./qemu-tools.js";

/** What the probe initramfs prints once it reaches userspace. The image builder's probe /init must match. */
export const PROBE_MARKER = "FORKD-PROBE-OK";

/**
 * A real KVM boots the probe in about a second; ten times that still answers quickly on a loaded host.
 * On a PVM host this is what the KVM probe costs, once per boot (the verdict is cached).
 */
export const KVM_PROBE_DEADLINE_MS = 10_000;

/** The probe reaches userspace in ~5 s under TCG on an idle 2-core host; a loaded CI host needs margin. */
export const TCG_PROBE_DEADLINE_MS = 60_000;

/** Console polling interval while a probe boots: small next to a boot, cheap next to a file read. */
export const PROBE_POLL_MS = 50;

/** Guest RAM for the probe: the kernel and a busybox initramfs need well under this. */
export const PROBE_MEMORY_MIB = 128;

/** Bump when the probe's meaning changes, so cached verdicts of an older probe are ignored. */
export const PROBE_FORMAT_VERSION = 1;

export const PROBE_CACHE_FILE = "accel-probe.json";

/** Temp run dirs of probes: <tmpdir>/forkd-probe-<pid>-<accel>-XXXXXX */
const PROBE_DIR_PREFIX = "forkd-probe-";

export interface AcceleratorVerdict {
  usable: boolean;
  /** Why, in words: what was tried and what happened. */
  reason: string;
  /** Spawn to marker, when the probe booted. */
  bootMs?: number;
}

export interface AcceleratorProbe {
  /** The accelerator to run guests with. */
  accel: Accelerator;
  kvm: AcceleratorVerdict;
  tcg: AcceleratorVerdict;
  qemuVersion: string;
  /** The host TSC frequency to give TCG guests (MachineSpec.tscKhz), when known. */
  tscKhz: number | undefined;
  probedAt: string;
  /** True when this answer came from the cache file. */
  cached: boolean;
}

export interface ProbeOptions {
  kernel: string;
  probeInitrd: string;
  /** Deadline for the KVM probe boot. Default KVM_PROBE_DEADLINE_MS. */
  deadlineMs?: number;
  /** Deadline for the TCG probe boot. Default TCG_PROBE_DEADLINE_MS. */
  tcgDeadlineMs?: number;
  signal?: AbortSignal;
  qemuBinary?: string;
  /** Cache file; default <hostState>/accel-probe.json; null disables the cache. */
  cacheFile?: string | null;
  /** Probe again even if the cache has an answer (the new answer is cached). */
  refresh?: boolean;
  /** How the probe VM is started (the caller's confinement), as for every other VM. */
  confine?: ConfineVm;
}

/**
 * The caller's way of starting a VM: `spec` as it should run (seccomp, a monitor fd) and the launcher prefix
 * it goes through (none: plain QEMU), for a VM whose run directory is `runDir`.
 */
export type ConfineVm = (
  spec: MachineSpec,
  runDir: string,
) => { spec: MachineSpec; prefix: readonly string[] | undefined; env?: Record<string, string> };

interface CacheKey {
  format: number;
  bootId: string;
  qemuBinary: string;
  qemuVersion: string;
  kernelSha256: string;
}

/** Probes KVM then TCG (or answers from the cache). Throws `unavailable` when neither boots the probe. */
export async function probeAccelerator(options: ProbeOptions): Promise<AcceleratorProbe> {
  const version = await qemuVersion(options.qemuBinary);
  const key: CacheKey = {
    format: PROBE_FORMAT_VERSION,
    bootId: await readBootId(),
    qemuBinary: options.qemuBinary ?? process.env.FORKD_QEMU_BINARY ?? "qemu-system-x86_64",
    qemuVersion: version.banner,
    kernelSha256: await sha256File(options.kernel),
  };
  const cacheFile =
    options.cacheFile === null
      ? undefined
      : (options.cacheFile ?? path.join(resolvePaths().hostState, PROBE_CACHE_FILE));
  if (cacheFile && !options.refresh) {
    const cached = await readCache(cacheFile, key);
    if (cached) return cached;
  }

  const tsc = detectHostTsc();
  const kvmState = describeKvmDevice();
  let kvm: AcceleratorVerdict;
  if (!kvmState.openable) {
    kvm = { usable: false, reason: `not usable: ${kvmState.text}` };
  } else {
    kvm = await bootProbe("kvm", options, options.deadlineMs ?? KVM_PROBE_DEADLINE_MS, undefined);
    kvm.reason = `${kvm.reason} (${kvmState.text})`;
  }
  const tcg = await bootProbe("tcg", options, options.tcgDeadlineMs ?? TCG_PROBE_DEADLINE_MS, tsc?.khz);
  if (tsc) tcg.reason = `${tcg.reason} (host TSC ${tsc.khz} kHz from ${tsc.source})`;

  if (!kvm.usable && !tcg.usable) {
    throw new ForkdError(
      "unavailable",
      `no accelerator boots the guest kernel: kvm ${kvm.reason}; tcg ${tcg.reason}`,
      {
        detail: { kvm, tcg },
      },
    );
  }
  const result: AcceleratorProbe = {
    accel: kvm.usable ? "kvm" : "tcg",
    kvm,
    tcg,
    qemuVersion: version.version,
    tscKhz: tsc?.khz,
    probedAt: new Date().toISOString(),
    cached: false,
  };
  if (cacheFile) await writeCache(cacheFile, key, result);
  return result;
}

/** Boots the probe once under `accel`; resolves with a verdict (never throws, except when aborted). */
async function bootProbe(
  accel: Accelerator,
  options: ProbeOptions,
  deadlineMs: number,
  tscKhz: number | undefined,
): Promise<AcceleratorVerdict> {
  await removeStaleProbeDirs();
  const runDir = await fsp.mkdtemp(path.join(os.tmpdir(), `${PROBE_DIR_PREFIX}${process.pid}-${accel}-`));
  const plainSpec: MachineSpec = {
    accel,
    cpuModel: accel === "kvm" ? "host" : "max",
    memoryMiB: PROBE_MEMORY_MIB,
    vcpus: 1,
    kernel: options.kernel,
    initrd: options.probeInitrd,
    kernelCmdline: "console=ttyS0 loglevel=4 panic=-1",
    tscKhz: accel === "tcg" ? tscKhz : undefined,
    disk: null,
    qmpSocketPath: path.join(runDir, "qmp.sock"),
    consoleSocketPath: path.join(runDir, "console.sock"),
  };
  const confined = options.confine?.(plainSpec, runDir) ?? { spec: plainSpec, prefix: undefined };
  const spec = confined.spec;
  const seconds = Math.round(deadlineMs / 100) / 10;
  let vm: VmHandle | undefined;
  const started = performance.now();
  try {
    vm = await launchVm(spec, {
      signal: options.signal,
      qemuBinary: options.qemuBinary,
      prefix: confined.prefix,
      env: confined.env,
    });
    // A plain clock comparison: polling `.aborted` of an AbortSignal.any() deadline is unreliable on Node 20.
    const deadlineAt = performance.now() + deadlineMs;
    for (;;) {
      if (options.signal?.aborted) throw abortError(options.signal, `${accel} probe`);
      const output = await vm.consoleTail();
      if (output.includes(PROBE_MARKER)) {
        const bootMs = Math.round(performance.now() - started);
        return { usable: true, reason: `usable: the probe guest reached userspace in ${bootMs} ms`, bootMs };
      }
      const exit = vm.process.exitStatus;
      if (exit) {
        return {
          usable: false,
          reason:
            `not usable: QEMU stopped before the guest reached userspace: ${vm.process.describe()}` +
            lastConsoleLine(output),
        };
      }
      if (performance.now() >= deadlineAt) {
        return {
          usable: false,
          reason: `not usable: guest kernel did not reach userspace within ${seconds}s${lastConsoleLine(output)}`,
        };
      }
      await sleep(PROBE_POLL_MS, options.signal).catch(() => {});
    }
  } catch (err) {
    if (options.signal?.aborted) throw err;
    return { usable: false, reason: `not usable: could not run the probe: ${errorMessage(err)}` };
  } finally {
    await vm?.kill({ graceMs: 0 }).catch(() => {});
    await fsp.rm(runDir, { recursive: true, force: true });
  }
}

/**
 * Probe run dirs carry their creator's pid, so a probe whose program was killed (no `finally` ran) has its
 * directory removed by the next probe.
 */
async function removeStaleProbeDirs(): Promise<void> {
  let names: string[];
  try {
    names = await fsp.readdir(os.tmpdir());
  } catch {
    return;
  }
  for (const name of names) {
    const pid = Number(new RegExp(`^${PROBE_DIR_PREFIX}(\\d+)-`).exec(name)?.[1]);
    if (!pid || pid === process.pid || processExists(pid)) continue;
    await fsp.rm(path.join(os.tmpdir(), name), { recursive: true, force: true }).catch(() => {});
  }
}

function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

function lastConsoleLine(console: string): string {
  const line = console.trim().split("\n").pop()?.trim();
  return line ? `; last console line: ${JSON.stringify(line.slice(0, 200))}` : "; the console stayed empty";
}

function describeKvmDevice(): { openable: boolean; text: string } {
  const modules = ["kvm_intel", "kvm_amd", "kvm_pvm"].filter((m) => fs.existsSync(`/sys/module/${m}`));
  const moduleText =
    modules.length > 0 ? `loaded: ${modules.join(", ")}` : "no kvm_intel/kvm_amd module loaded";
  const pvm = modules.includes("kvm_pvm") ? "; kvm_pvm runs only PVM-enabled guest kernels" : "";
  try {
    fs.closeSync(fs.openSync("/dev/kvm", "r+"));
    return { openable: true, text: `/dev/kvm present and opens read-write; ${moduleText}${pvm}` };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const what = code === "ENOENT" ? "/dev/kvm does not exist" : `/dev/kvm cannot be opened (${code})`;
    return { openable: false, text: `${what}; ${moduleText}` };
  }
}

async function readBootId(): Promise<string> {
  try {
    return (await fsp.readFile("/proc/sys/kernel/random/boot_id", "utf8")).trim();
  } catch {
    return "unknown";
  }
}

async function sha256File(file: string): Promise<string> {
  const hash = createHash("sha256");
  try {
    for await (const chunk of fs.createReadStream(file)) hash.update(chunk as Buffer);
  } catch (err) {
    throw new ForkdError("not_found", `cannot read guest kernel ${file}: ${errorMessage(err)}`);
  }
  return hash.digest("hex");
}

async function readCache(file: string, key: CacheKey): Promise<AcceleratorProbe | undefined> {
  try {
    const parsed = JSON.parse(await fsp.readFile(file, "utf8")) as {
      key?: unknown;
      result?: AcceleratorProbe;
    };
    if (JSON.stringify(parsed.key) !== JSON.stringify(key)) return undefined;
    const result = parsed.result;
    if (!result || (result.accel !== "kvm" && result.accel !== "tcg") || !result.kvm || !result.tcg)
      return undefined;
    return { ...result, tscKhz: result.tscKhz ?? undefined, cached: true };
  } catch {
    return undefined;
  }
}

async function writeCache(file: string, key: CacheKey, result: AcceleratorProbe): Promise<void> {
  await fsp.mkdir(path.dirname(file), { recursive: true });
  const partial = `${file}.${randomBytes(4).toString("hex")}.partial`;
  try {
    await fsp.writeFile(partial, `${JSON.stringify({ key, result }, null, 2)}\n`, { mode: 0o644 });
    await fsp.rename(partial, file);
  } finally {
    await fsp.rm(partial, { force: true });
  }
}
