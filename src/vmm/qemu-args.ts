/**
 * The one place QEMU's command line is produced. A `MachineSpec` describes one VM; `buildQemuArgs` turns it
 * into an argv array (never a shell string).
 *
 * RESTORE INVARIANT: a child restored from a parent's device state must be started with the same machine and
 * the same devices, under the same ids, in the same order, as the parent. QEMU matches saved device state to
 * devices by id/path; a mismatch either fails the load ("Unknown savevm section", "Configuration section
 * missing") or, worse, loads state into the wrong device and corrupts the guest. That is why every device id
 * below is a constant, why the device set depends only on the spec's machine-shape fields, and why
 * `restoreCompatibilityKey` exists: callers store it with a snapshot and compare it before a restore.
 * Only per-instance values may differ between parent and child: file paths (sockets, console, disk overlay),
 * `memory.shared`, `restore`, `startPaused`, the NIC's backend, and how the host confines QEMU (`seccomp`) and
 * collects its console: neither is guest-visible state.
 */
import { createHash } from "node:crypto";
import path from "node:path";
import { invalidArgument } from "../common/errors.js";
import { assertCpuModel } from "./cpu-model.js";

/** virtio-serial port name the guest agent looks up under /sys/class/virtio-ports/<port>/name. */
export const AGENT_PORT_NAME = "org.forkd.agent";

/**
 * The fd number at which a restoring child receives the parent's device-state file (see `-incoming fd:N`).
 * 0-2 are QEMU's stdio; 3 is the first free slot of spawn's stdio array.
 */
export const DEVICE_STATE_FD = 3;

/** The fd at which QEMU finds the NIC's tap (`-netdev tap,fd=N`), opened for it by the launcher. */
export const TAP_FD = 4;

/** The fd at which a confined QEMU finds its monitor's listening socket, bound for it by the launcher. */
export const QMP_FD = 5;

/** Device and object ids. Identical for parent and child: see the RESTORE INVARIANT above. */
export const DEVICE_IDS = Object.freeze({
  memoryBackend: "mem",
  consoleChardev: "ser0",
  diskNode: "disk0",
  diskDevice: "blk0",
  virtioSerial: "vser0",
  agentChardev: "agent",
  agentPort: "port0",
  rng: "rng0",
  netdev: "net0",
  nic: "nic0",
  /** The monitor's chardev when QMP comes as a listening fd (host-side only: not part of any device state). */
  qmpChardev: "qmp0",
});

/** A virtio-net NIC's MAC: six lower-case hex pairs. */
const MAC_PATTERN = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;

/**
 * TCG's default translation cache is 1 GiB per QEMU process and dominates per-VM host memory. It trades memory
 * against CPU: a restored child retranslates the guest code it runs, and a small cache flushes and translates
 * again. Measured (30 children from pyagent, each evaluating one numpy expression; PSS / host CPU per child):
 * 4 MiB 24 MiB / 1.2 s, 8 MiB 28 MiB / 0.84 s, 16 MiB 37 MiB / 0.53 s, 24 MiB 46 MiB / 0.42 s, 32 MiB 49 MiB /
 * 0.42 s. Re-measured with the Go agent, sizes interleaved in one run (bench/tcg-cache, 8 children each; CPU
 * to first answer / a second, different cell / PSS): 8 MiB 309 / 167 ms / 27.1 MiB, 16 MiB 243 / 116 ms /
 * 36.2 MiB, 24 MiB 235 / 30 ms / 39.5 MiB, 32 and 48 MiB no better than 24. At 16 MiB the first cells already
 * fill the cache and it is flushed (everything translated again); 24 MiB is the smallest size without that
 * flush, for +3.3 MiB PSS.
 */
export const DEFAULT_TCG_TB_SIZE_MIB = 24;

/** Linux's x86 COMMAND_LINE_SIZE; a longer -append is truncated silently by the boot protocol. */
export const MAX_KERNEL_CMDLINE_BYTES = 2047;

/** sizeof(sockaddr_un.sun_path) minus the terminating NUL: a longer unix socket path cannot be bound. */
export const MAX_UNIX_SOCKET_PATH_BYTES = 107;

/** Bounds that catch unit mistakes (bytes vs MiB) before QEMU fails with a less helpful message. */
export const MIN_MEMORY_MIB = 64;
export const MAX_MEMORY_MIB = 256 * 1024;
/** microvm has no ACPI CPU hotplug tables for large counts; 64 is far above any sandbox's need. */
export const MAX_VCPUS = 64;
export const MAX_TCG_TB_SIZE_MIB = 1024;
/** Any x86 TSC made this century runs between these; outside them the value is a unit mistake. */
export const MIN_TSC_KHZ = 100_000;
export const MAX_TSC_KHZ = 10_000_000;

export type Accelerator = "kvm" | "tcg";

export interface MachineSpec {
  accel: Accelerator;
  /** TCG translation-block cache size; ignored under KVM. Default `DEFAULT_TCG_TB_SIZE_MIB`. */
  tcgTbSizeMiB?: number;
  /**
   * TCG only: the host's TSC frequency (see host-tsc.ts), passed to the guest kernel as `tsc_early_khz=`.
   * Without it a TCG guest booting on a busy host can fail its TSC calibration and hang.
   */
  tscKhz?: number;
  /** QEMU -cpu model, e.g. "Nehalem" or "max" (TCG) or "host" (KVM); checked by cpu-model.ts. */
  cpuModel: string;
  memoryMiB: number;
  vcpus: number;
  /**
   * Guest RAM backed by a file. `shared: true` (parent) maps it MAP_SHARED so the guest writes into the file;
   * `shared: false` (child) maps it MAP_PRIVATE: pages stay shared with the file until the child writes them.
   * Omit for anonymous RAM (probes and throwaway boots; such a VM cannot be snapshotted).
   */
  memoryFile?: { path: string; shared: boolean };
  kernel: string;
  initrd: string;
  kernelCmdline: string;
  /** qcow2 overlay attached as virtio-blk; `null` for no disk. */
  disk: { overlayPath: string } | null;
  /** Agent channel: QEMU connects as a client to a socket the host listens on. Omit for no agent channel. */
  agent?: { socketPath: string; portName?: string };
  qmpSocketPath: string;
  /**
   * QMP's socket is already bound (at `qmpSocketPath`) and listening at this fd (the launcher's doing, so a
   * confined QEMU never creates a file); without it QEMU binds `qmpSocketPath` itself.
   */
  qmpFd?: number;
  /**
   * The serial console: QEMU connects to this socket (the host listens first, as for the agent) and the host
   * keeps what it reads in a bounded log (launch.ts), so a guest cannot fill the host's disk through it.
   */
  consoleSocketPath: string;
  /**
   * QEMU's seccomp sandbox: `-sandbox on` with obsolete system calls, privilege changes, spawning processes
   * and resource control (scheduling, affinity, rlimits) all denied.
   */
  seccomp?: boolean;
  /**
   * Child restore: load this device-state file (passed to QEMU as fd DEVICE_STATE_FD). `deferred`: start
   * with `-incoming defer` (devices realised, waiting) and load it later with `startIncoming` (a warm pool).
   */
  restore?: { deviceStatePath: string; deferred?: boolean };
  /** -S: do not run the guest until QMP `cont` (also after a restore completes). */
  startPaused?: boolean;
  /** Entropy for the guest (/dev/hwrng). Part of the device set: must match between parent and child. */
  rng?: boolean;
  /**
   * A virtio-net NIC. Part of the device set (the MAC and `vnetHdr` must match between parent and child);
   * `backend` is per instance: a tap QEMU finds open at TAP_FD, or nothing (the NIC then has no peer and
   * every frame it sends is dropped). `vnetHdr` (offloads) needs a tap opened with IFF_VNET_HDR: QEMU saves
   * whether the NIC had it, and a child whose NIC differs cannot load its parent's state.
   */
  nic?: { mac: string; vnetHdr: boolean; backend: "tap" | "none" };
}

/** What `-sandbox` is given when `MachineSpec.seccomp` is set. */
export const SECCOMP_SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/** Builds QEMU's argv (without the binary) for `spec`. Throws `invalid_argument` naming the bad field. */
export function buildQemuArgs(spec: MachineSpec): string[] {
  return renderArgs(spec, "run");
}

/**
 * "identity" renders what the guest's machine is made of and nothing the host chooses per run: the console's
 * backend appears as the file chardev it was before consoles became sockets and there is no -sandbox, so the
 * restore key of every snapshot taken before either existed is unchanged.
 */
function renderArgs(spec: MachineSpec, mode: RenderMode): string[] {
  validateSpec(spec);
  return [
    ...machineArgs(spec),
    // A restored child never boots: its CPU state comes from the device state and its RAM from the memory file.
    // Without -kernel QEMU also skips keeping its 8 MiB copy of the kernel image (-9..12 ms CPU, -8 MiB per child).
    ...(spec.restore ? [] : ["-kernel", spec.kernel, "-initrd", spec.initrd, "-append", kernelCmdline(spec)]),
    ...consoleArgs(spec, mode),
    ...deviceArgs(spec),
    ...monitorArgs(spec, mode),
    ...lifecycleArgs(spec, mode),
  ];
}

type RenderMode = "run" | "identity";

/** The machine, accelerator, CPU, RAM (and its memory file). */
function machineArgs(spec: MachineSpec): string[] {
  const ids = DEVICE_IDS;
  // ioapic2=off: no second IOAPIC and fewer virtio-mmio transports to create (-5 ms CPU per QEMU start under
  // TCG); x-option-roms=off: no option ROMs to load (-1 ms). Both change the machine: parent and child match.
  const machine = ["microvm", "acpi=on", "ioapic2=off", "x-option-roms=off", "suppress-vmdesc=on"];
  if (spec.memoryFile) machine.push(`memory-backend=${ids.memoryBackend}`);

  const args: string[] = [
    "-M",
    machine.join(","),
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-accel",
    spec.accel === "tcg" ? `tcg,tb-size=${spec.tcgTbSizeMiB ?? DEFAULT_TCG_TB_SIZE_MIB}` : "kvm",
    "-cpu",
    spec.cpuModel,
    "-m",
    `${spec.memoryMiB}M`,
    "-smp",
    String(spec.vcpus),
  ];
  if (spec.memoryFile) {
    args.push(
      "-object",
      `memory-backend-file,id=${ids.memoryBackend},size=${spec.memoryMiB}M,` +
        `mem-path=${spec.memoryFile.path},share=${spec.memoryFile.shared ? "on" : "off"}`,
    );
  }
  return args;
}

function consoleArgs(spec: MachineSpec, mode: RenderMode): string[] {
  const ids = DEVICE_IDS;
  return [
    "-chardev",
    mode === "identity"
      ? `file,id=${ids.consoleChardev},path=${spec.consoleSocketPath}`
      : `socket,id=${ids.consoleChardev},path=${spec.consoleSocketPath},server=off`,
    "-serial",
    `chardev:${ids.consoleChardev}`,
  ];
}

/** The virtio devices: disk, agent port, RNG, NIC. */
function deviceArgs(spec: MachineSpec): string[] {
  const ids = DEVICE_IDS;
  const args: string[] = [];
  if (spec.disk) {
    args.push(
      "-blockdev",
      `driver=qcow2,node-name=${ids.diskNode},file.driver=file,file.filename=${spec.disk.overlayPath}`,
      "-device",
      `virtio-blk-device,drive=${ids.diskNode},id=${ids.diskDevice}`,
    );
  }
  if (spec.agent) {
    // server=off: the host listens and QEMU connects while it starts, i.e. before an incoming restore is
    // loaded. The guest therefore never sees the port's host side disconnected across a restore.
    args.push(
      "-device",
      `virtio-serial-device,id=${ids.virtioSerial}`,
      "-chardev",
      `socket,id=${ids.agentChardev},path=${spec.agent.socketPath},server=off`,
      "-device",
      `virtserialport,chardev=${ids.agentChardev},name=${spec.agent.portName ?? AGENT_PORT_NAME},id=${ids.agentPort}`,
    );
  }
  if (spec.rng) args.push("-device", `virtio-rng-device,id=${ids.rng}`);
  if (spec.nic) {
    if (spec.nic.backend === "tap") {
      args.push(
        "-netdev",
        // QEMU takes the offloads (vnet_hdr) from how the fd was opened; it refuses vnet_hdr= with fd=.
        `tap,id=${ids.netdev},fd=${TAP_FD}`,
        "-device",
        `virtio-net-device,id=${ids.nic},netdev=${ids.netdev},mac=${spec.nic.mac}`,
      );
    } else {
      args.push("-device", `virtio-net-device,id=${ids.nic},mac=${spec.nic.mac}`);
    }
  }
  return args;
}

/** QMP: on an inherited fd when running (and given one), else on its socket path. */
function monitorArgs(spec: MachineSpec, mode: RenderMode): string[] {
  const ids = DEVICE_IDS;
  if (spec.qmpFd !== undefined && mode === "run") {
    return [
      "-chardev",
      `socket,id=${ids.qmpChardev},fd=${spec.qmpFd},server=on,wait=off`,
      "-mon",
      `chardev=${ids.qmpChardev},mode=control`,
    ];
  }
  return ["-qmp", `unix:${spec.qmpSocketPath},server=on,wait=off`];
}

/** How the VM starts and ends: no reboot, the seccomp sandbox, paused, or restoring incoming state. */
function lifecycleArgs(spec: MachineSpec, mode: RenderMode): string[] {
  // The guest's reboot means "this VM is done": exit instead of rebooting into a fresh boot.
  const args = ["-no-reboot"];
  if (spec.seccomp && mode === "run") args.push("-sandbox", SECCOMP_SANDBOX);
  if (spec.startPaused) args.push("-S");
  if (spec.restore) {
    // xen-save-devices-state writes no configuration section, so the receiver must not expect one.
    const incoming = spec.restore.deferred ? "defer" : `fd:${DEVICE_STATE_FD}`;
    args.push("-incoming", incoming, "-global", "migration.send-configuration=off");
    // After an incoming migration QEMU announces the NIC (RARPs, and makes the guest send gratuitous ARPs) for
    // switches that must learn where it moved. A child's namespace is new and the MAC fixed: nothing to learn,
    // and under TCG every round costs the child guest work (measured: ~25 ms of CPU per child with a NIC).
    if (spec.nic) args.push("-global", "migration.announce-rounds=0");
  }
  return args;
}

/**
 * A digest of everything that must be equal between a snapshot's parent and a restoring child (machine,
 * devices, ids, RAM size, kernel and initrd paths), with per-instance values left out. Store it with a
 * snapshot; refuse a restore whose spec gives a different key.
 */
export function restoreCompatibilityKey(spec: MachineSpec): string {
  const placeholder = "/forkd-instance-path";
  const shape: MachineSpec = {
    ...spec,
    // What a child does not boot with cannot break its restore: the kernel, initrd and cmdline only matter to
    // the parent's boot, and their host paths change when an image cache moves (packs, other hosts).
    kernel: placeholder,
    initrd: placeholder,
    kernelCmdline: "-",
    tscKhz: undefined,
    // The translation cache is the host's business (not guest-visible state). A fixed value, so changing the
    // default never orphans existing snapshots.
    tcgTbSizeMiB: 16,
    memoryFile: spec.memoryFile ? { path: placeholder, shared: true } : undefined,
    disk: spec.disk ? { overlayPath: placeholder } : null,
    agent: spec.agent ? { socketPath: placeholder, portName: spec.agent.portName } : undefined,
    qmpSocketPath: placeholder,
    qmpFd: undefined,
    consoleSocketPath: placeholder,
    seccomp: undefined,
    restore: undefined,
    startPaused: false,
    // The backend is per instance; what the guest saw (MAC, offloads) is not.
    nic: spec.nic ? { ...spec.nic, backend: "tap" } : undefined,
  };
  // Offloads are not on the command line (the tap fd carries them) but in the NIC's saved state.
  const identity = shape.nic
    ? [renderArgs(shape, "identity"), { nicVnetHdr: shape.nic.vnetHdr }]
    : renderArgs(shape, "identity");
  return createHash("sha256").update(JSON.stringify(identity)).digest("hex");
}

/** The guest kernel's command line: the spec's, plus what the accelerator needs. */
export function kernelCmdline(spec: MachineSpec): string {
  if (spec.accel === "tcg" && spec.tscKhz !== undefined)
    return `${spec.kernelCmdline} tsc_early_khz=${spec.tscKhz}`;
  return spec.kernelCmdline;
}

function validateSpec(spec: MachineSpec): void {
  if (spec.accel !== "kvm" && spec.accel !== "tcg") {
    throw invalidArgument(`machine spec: accel must be "kvm" or "tcg", got ${JSON.stringify(spec.accel)}`);
  }
  if (spec.tcgTbSizeMiB !== undefined) {
    assertIntegerIn("tcgTbSizeMiB", spec.tcgTbSizeMiB, 1, MAX_TCG_TB_SIZE_MIB);
  }
  assertCpuModel(spec.cpuModel);
  if (spec.tscKhz !== undefined) assertIntegerIn("tscKhz", spec.tscKhz, MIN_TSC_KHZ, MAX_TSC_KHZ);
  assertIntegerIn("memoryMiB", spec.memoryMiB, MIN_MEMORY_MIB, MAX_MEMORY_MIB);
  assertIntegerIn("vcpus", spec.vcpus, 1, MAX_VCPUS);
  if (spec.memoryFile) assertOptionPath("memoryFile.path", spec.memoryFile.path);
  assertOptionPath("kernel", spec.kernel);
  assertOptionPath("initrd", spec.initrd);
  if (
    typeof spec.kernelCmdline !== "string" ||
    Buffer.byteLength(spec.kernelCmdline) > MAX_KERNEL_CMDLINE_BYTES
  ) {
    throw invalidArgument(
      `machine spec: kernelCmdline must be a string of at most ${MAX_KERNEL_CMDLINE_BYTES} bytes`,
    );
  }
  if (/[\n\r\0]/.test(spec.kernelCmdline)) {
    throw invalidArgument("machine spec: kernelCmdline must not contain newlines or NUL");
  }
  assertSocketPath("consoleSocketPath", spec.consoleSocketPath);
  assertSocketPath("qmpSocketPath", spec.qmpSocketPath);
  if (spec.qmpFd !== undefined) assertIntegerIn("qmpFd", spec.qmpFd, 3, 1023);
  if (spec.disk) assertOptionPath("disk.overlayPath", spec.disk.overlayPath);
  if (spec.agent) {
    assertSocketPath("agent.socketPath", spec.agent.socketPath);
    const port = spec.agent.portName ?? AGENT_PORT_NAME;
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(port)) {
      throw invalidArgument(
        `machine spec: agent.portName ${JSON.stringify(port)} must match [A-Za-z0-9][A-Za-z0-9._-]*`,
      );
    }
  }
  // Passed as an fd, so commas would not matter to QEMU; still require an absolute path for clarity.
  if (spec.restore) assertOptionPath("restore.deviceStatePath", spec.restore.deviceStatePath);
  if (spec.nic) {
    if (!MAC_PATTERN.test(spec.nic.mac)) {
      throw invalidArgument(
        `machine spec: nic.mac ${JSON.stringify(spec.nic.mac)} is not a MAC like 02:fd:00:00:00:02`,
      );
    }
    if (spec.nic.backend !== "tap" && spec.nic.backend !== "none") {
      throw invalidArgument('machine spec: nic.backend must be "tap" or "none"');
    }
    if (spec.nic.backend === "none" && spec.nic.vnetHdr) {
      throw invalidArgument("machine spec: a NIC with offloads (vnetHdr) needs a tap backend");
    }
  }
  if (spec.restore && !spec.memoryFile) {
    throw invalidArgument("machine spec: restore needs memoryFile (the parent's RAM file) to restore from");
  }
}

/**
 * Paths end up inside QEMU's comma-separated option syntax (`path=<p>,server=off`), where a comma would split
 * the value into a new (attacker-chosen) option. Doubling commas is QEMU's escape, but only some parsers
 * honour it, so commas are refused rather than escaped.
 */
function assertOptionPath(field: string, value: unknown): void {
  if (typeof value !== "string" || value.length === 0) {
    throw invalidArgument(`machine spec: ${field} must be a non-empty path`);
  }
  if (!path.isAbsolute(value)) {
    throw invalidArgument(`machine spec: ${field} must be an absolute path, got ${JSON.stringify(value)}`);
  }
  if (value.includes(",")) {
    throw invalidArgument(
      `machine spec: ${field} ${JSON.stringify(value)} contains a comma, which QEMU's option syntax would treat ` +
        "as the start of another option; use a path without commas",
    );
  }
  if (/[\0\n\r]/.test(value)) {
    throw invalidArgument(`machine spec: ${field} must not contain NUL or newline characters`);
  }
}

function assertSocketPath(field: string, value: unknown): void {
  assertOptionPath(field, value);
  if (Buffer.byteLength(value as string) > MAX_UNIX_SOCKET_PATH_BYTES) {
    throw invalidArgument(
      `machine spec: ${field} ${JSON.stringify(value)} is longer than ${MAX_UNIX_SOCKET_PATH_BYTES} bytes, ` +
        "the limit for a unix socket path; use a shorter run directory",
    );
  }
}

function assertIntegerIn(field: string, value: unknown, min: number, max: number): void {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw invalidArgument(
      `machine spec: ${field} must be an integer in [${min}, ${max}], got ${String(value)}`,
    );
  }
}
