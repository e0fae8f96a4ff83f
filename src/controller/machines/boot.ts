/**
 * Booting a fresh VM from an image to a warm agent: used for a snapshot's parent and for the cold-boot
 * baseline the spawn benchmark compares forks against. The guest agent announces itself with a hello when it
 * has opened its port: that handshake, never a fixed sleep, is what "booted" means.
 */
import { mkdir, open } from "node:fs/promises";
import { AgentClient } from "../../agent/host/client.js";
import { deadlineSignal, sleep } from "../../common/deadline.js";
import { ForkdError } from "../../common/errors.js";
import { GUEST_MAC } from "../../common/guest-network.js";
import type { BuiltImage, Template } from "../../image/index.js";
import { type ConfinementConfig, resolveConfinement } from "../../isolation/confinement.js";
import { privateNetnsUnavailable } from "../../isolation/launcher.js";
import { cpuModelFor } from "../../vmm/cpu-model.js";
import { launchVm, type VmHandle } from "../../vmm/launch.js";
import { describeExit, type QemuExit } from "../../vmm/qemu-process.js";
import type { FileOwner } from "../../vmm/unix-listener.js";
import { type NicAttachment, privateNic } from "../networks/sandbox-networks.js";
import type { AcceleratorChoice } from "./accelerator.js";
import { type MachineShape, machineSpec } from "./machine.js";
import { guestCommandsOf, startAndWaitReady } from "./start-ready.js";
import { confineSpec, vmOwner, vmStart } from "./vm-launch.js";

/**
 * Kernel arguments the runtime adds to the image's own. `tsc=reliable`: under TCG the guest's jiffies-based
 * clocksource watchdog sees the TSC skew whenever the host is loaded, marks it unstable and falls back to
 * jiffies; without a continuous clocksource there are no high-resolution timers and no tickless idle, so every
 * idle child takes 250 timer interrupts a second (measured: 15 ms of host CPU per idle child per second, which
 * with 100 children saturated 2 cores). The TSC itself follows QEMU's virtual clock and is monotonic.
 */
export const GUEST_RUNTIME_CMDLINE = "tsc=reliable";

/**
 * Added under TCG: `norandmaps` (no address-space randomisation in the guest). QEMU 7.2's translator keys
 * translated code by virtual address, so with ASLR every process the guest starts maps ld.so and libc somewhere
 * new and has them translated again; without it a process reuses what the last one translated (`exec true`:
 * measured 68-76 ms of host CPU with ASLR, 20-36 ms without; bench/command). Children of one snapshot share
 * their parent's layout anyway (they are copies of one memory); under KVM randomisation stays on.
 * `FORKD_TCG_GUEST_ASLR=1` keeps it on under TCG too (recorded in the snapshot's kernel command line).
 */
export const TCG_GUEST_CMDLINE = "norandmaps";

/** What the runtime adds to an image's kernel command line on accelerator `accel`. */
export function guestRuntimeCmdline(accel: "kvm" | "tcg", env: NodeJS.ProcessEnv = process.env): string {
  return accel === "tcg" && env.FORKD_TCG_GUEST_ASLR !== "1"
    ? `${GUEST_RUNTIME_CMDLINE} ${TCG_GUEST_CMDLINE}`
    : GUEST_RUNTIME_CMDLINE;
}

/** A cold boot to the agent's hello: ~20 s under TCG on a 2-core host, ~1 s under KVM. */
export const BOOT_TIMEOUT_MS = { tcg: 240_000, kvm: 60_000 } as const;
/** Warm-up code (e.g. `import numpy`) takes seconds under TCG. */
export const WARMUP_TIMEOUT_MS = 300_000;

export interface BootedVm {
  vm: VmHandle;
  /** Who the VM's QEMU runs as (null: this process's user); files made for it are handed over. */
  owner: FileOwner | null;
  agent: AgentClient;
  shape: MachineShape;
  bootMs: number;
  warmupMs: number;
  /** Time from starting the template's `start` command until its `ready` command succeeded (0: neither). */
  readyMs: number;
}

/** What booting a parent needs of its template (a built image carries it too: `BuiltImage.template`). */
export type BootTemplate = Pick<Template, "name" | "memoryMib" | "vcpus" | "interpreter"> & {
  warmup?: string | null;
  /** "nic" (the default) or "none". */
  network?: Template["network"];
  /** The template's egress default, recorded in the snapshot's manifest (none for a bare image). */
  egress?: Template["egress"];
  /** The template file, for errors. */
  source?: string;
  /** Format 2: started in the parent and polled until ready before the warm-up (none for a bare image). */
  start?: Template["start"];
  ready?: Template["ready"];
};

export function machineShape(
  template: BootTemplate,
  image: BuiltImage,
  accel: AcceleratorChoice,
): MachineShape {
  return {
    accel: accel.accel,
    tscKhz: accel.tscKhz,
    cpuModel: cpuModelFor(accel.accel),
    memoryMiB: template.memoryMib,
    vcpus: template.vcpus,
    kernel: image.kernel,
    initrd: image.initrd,
    kernelCmdline: `${image.manifest.kernel.cmdline} ${guestRuntimeCmdline(accel.accel)}`,
  };
}

/**
 * The parent's NIC (a parent never has an uplink: it is booted, warmed and saved). With offloads on a tap in
 * a private namespace where the host can give it one, so children on their namespaces' taps get offloads too;
 * without a peer (and so without offloads) where it cannot.
 */
export async function parentNic(): Promise<{
  shape: NonNullable<MachineShape["nic"]>;
  attachment: NicAttachment;
}> {
  const vnetHdr = (await privateNetnsUnavailable()) === null;
  return { shape: { mac: GUEST_MAC, vnetHdr }, attachment: await privateNic(vnetHdr) };
}

/**
 * Boots `image` with RAM in `memoryFile` (MAP_SHARED, so the guest writes straight into it) on the disk
 * overlay `disk`, waits for the agent's hello and runs the template's warm-up. On failure the VM is killed and
 * the error carries the end of the guest console.
 */
export async function bootWarmVm(options: {
  template: BootTemplate;
  image: BuiltImage;
  accel: AcceleratorChoice;
  runDir: string;
  memoryFile: string;
  disk: string;
  /** Boot with a NIC (default: the template's `network`). */
  network?: boolean;
  /** What the disk overlay's backing chain reads (a symlink to the root filesystem, or the file itself). */
  diskBacking: readonly string[];
  /** Default: this process's (resolveConfinement()). */
  confinement?: ConfinementConfig;
  signal?: AbortSignal;
  onProgress?: (step: BootStep, message: string) => void;
}): Promise<BootedVm> {
  const { template, image, accel, runDir } = options;
  const progress = options.onProgress ?? (() => {});
  const nic = (options.network ?? template.network !== "none") ? await parentNic() : undefined;
  const shape: MachineShape = { ...machineShape(template, image, accel), nic: nic?.shape };
  const confinement = options.confinement ?? (await resolveConfinement());
  const started = performance.now();
  const bootDeadline = deadlineSignal(BOOT_TIMEOUT_MS[accel.accel], options.signal);
  const bootSignal = bootDeadline.signal;
  progress("boot", `booting ${template.name} (${shape.memoryMiB} MiB, ${accel.accel})`);
  const spec = confineSpec(
    confinement,
    machineSpec(shape, {
      runDir,
      memoryFile: options.memoryFile,
      shared: true,
      disk: options.disk,
      nicBackend: nic?.attachment.backend,
    }),
  );
  const vm = await (async () => {
    await mkdir(runDir, { recursive: true, mode: 0o700 });
    await createRamFile(options.memoryFile, shape.memoryMiB);
    const start = vmStart(confinement, {
      spec,
      runDir,
      readOnly: options.diskBacking,
      nic: nic?.attachment,
      // A parent is saved by the program that booted it; without that program it is of no use to anyone.
      dieWithParent: true,
    });
    return launchVm(spec, { runDir, signal: bootSignal, ...start });
  })().catch((err: unknown) => {
    bootDeadline.dispose();
    throw err;
  });
  let agent: AgentClient | undefined;
  try {
    agent = new AgentClient(await raceExit(vm, vm.agentConnection, "boot"));
    const hello = await raceExit(vm, agent.waitHello({ signal: bootSignal }), "boot");
    const bootMs = performance.now() - started;
    progress("boot", `agent ${hello.agentVersion} ready after ${(bootMs / 1000).toFixed(1)} s`);
    const readyMs = await startTemplate(vm, agent, template, image, progress, options.signal);
    const warmupMs = await warmUp(vm, agent, template, progress, options.signal);
    return { vm, owner: vmOwner(confinement, vm.pid), agent, shape, bootMs, warmupMs, readyMs };
  } catch (err) {
    agent?.close();
    throw await bootFailed(vm, err);
  } finally {
    bootDeadline.dispose();
  }
}

/** The template's start command and ready check, if it has them; how long they took (ms, 0 without). */
async function startTemplate(
  vm: VmHandle,
  agent: AgentClient,
  template: BootTemplate,
  image: BuiltImage,
  progress: (step: BootStep, message: string) => void,
  signal: AbortSignal | undefined,
): Promise<number> {
  if (!template.start && !template.ready) return 0;
  const started = performance.now();
  await raceExit(
    vm,
    startAndWaitReady(agent, guestCommandsOf(template, image), {
      what: `template ${template.name}`,
      progress: (message) => progress("ready", message),
      signal,
    }),
    "start/ready",
  );
  return performance.now() - started;
}

/**
 * A Python template is warmed even without warm-up code: the call also waits for the worker to be up, so the
 * snapshot never catches it half-started. Returns how long it took (0: not a Python template).
 */
async function warmUp(
  vm: VmHandle,
  agent: AgentClient,
  template: BootTemplate,
  progress: (step: BootStep, message: string) => void,
  signal: AbortSignal | undefined,
): Promise<number> {
  if (template.interpreter !== "python") return 0;
  progress("warmup", "running warm-up");
  const warmStarted = performance.now();
  const result = await raceExit(
    vm,
    agent.warmup(template.warmup ?? "", { timeoutMs: WARMUP_TIMEOUT_MS, signal }),
    "warm-up",
  );
  if (result.error) {
    throw new ForkdError(
      "unprocessable",
      `template ${template.name}: warm-up failed: ${result.error.type}: ${result.error.message}\n${result.error.traceback}`,
    );
  }
  const warmupMs = performance.now() - warmStarted;
  progress("warmup", `warm after ${(warmupMs / 1000).toFixed(1)} s`);
  return warmupMs;
}

/** A boot that failed kills its VM; the error carries the end of the guest console (unless it is the template's). */
async function bootFailed(vm: VmHandle, err: unknown): Promise<unknown> {
  const tail = await vm.consoleTail(2000).catch(() => "");
  await vm.kill({ graceMs: 0 }).catch(() => {});
  if (tail && !(err instanceof ForkdError && err.code === "unprocessable")) {
    return new ForkdError(
      err instanceof ForkdError ? err.code : "internal",
      `${err instanceof Error ? err.message : String(err)}\n--- guest console (last lines) ---\n${tail}`,
      { cause: err },
    );
  }
  return err;
}

export type BootStep = "boot" | "ready" | "warmup";

/**
 * The parent's RAM file, made at its full size before QEMU starts: an unprivileged QEMU cannot create files
 * outside its run directory, and QEMU only extends a file that is too small. Sparse: nothing is allocated
 * until the guest writes.
 */
async function createRamFile(file: string, memoryMiB: number): Promise<void> {
  const handle = await open(file, "wx", 0o600);
  try {
    await handle.truncate(memoryMiB * 2 ** 20);
  } finally {
    await handle.close();
  }
}

/**
 * When the agent's socket closes, QEMU's exit is often reaped a moment later; a failure within this window is
 * reported as the QEMU exit (the root cause) rather than as a closed connection.
 */
export const EXIT_ATTRIBUTION_MS = 300;

/** Rejects with the QEMU exit (and its output) if the VM dies while `work` is pending. */
export async function raceExit<T>(vm: VmHandle, work: Promise<T>, what: string): Promise<T> {
  const qemuExit = (exit: QemuExit) => {
    const output = vm.process.outputTail().trim();
    return new ForkdError("unavailable", `${what}: QEMU ${describeExit(exit)}${output ? `: ${output}` : ""}`);
  };
  const died = vm.exited.then((exit): never => {
    throw qemuExit(exit);
  });
  try {
    return await Promise.race([work, died]);
  } catch (err) {
    const exit = await Promise.race([vm.exited, sleep(EXIT_ATTRIBUTION_MS).then(() => undefined)]);
    throw exit ? qemuExit(exit) : err;
  }
}
