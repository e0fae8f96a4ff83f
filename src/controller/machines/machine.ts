/**
 * The machine a template's parent and children run on. Everything here must be identical between a parent and
 * the children restored from it; per-instance paths are filled in by the caller.
 */
import path from "node:path";
import { invalidArgument } from "../../common/errors.js";
import type { SnapshotManifest } from "../../store/manifest.js";
import { type Accelerator, MAX_TCG_TB_SIZE_MIB, type MachineSpec } from "../../vmm/qemu-args.js";

/** Names of the files inside a snapshot directory. */
export const SNAPSHOT_FILES = {
  /** Flat RAM image (template snapshots, full branches). */
  memory: "memory.bin",
  /** Changed pages only (diff and live branches). */
  memoryLayer: "memory.layer",
  deviceState: "vmstate",
  /** This snapshot's disk layer (qcow2), backed by the parent's disk layer or by `base.ext4`. */
  disk: "disk.qcow2",
  /**
   * Symlink to the image's root filesystem, the bottom of the disk chain. The disk layers name their backing
   * files relatively (`base.ext4`, `../<parent>/disk.qcow2`) so a snapshot tree can move between hosts and homes;
   * only this link is host-specific, and it is derived from the manifest's image hash.
   */
  baseDisk: "base.ext4",
} as const;

/** Names of the files inside a VM's run directory. */
export const RUN_FILES = {
  agentSocket: "agent.sock",
  qmpSocket: "qmp.sock",
  /** QEMU's serial console connects here; the host keeps its output in `console` (bounded, vmm/console-log.ts). */
  consoleSocket: "console.sock",
  console: "console.log",
  disk: "disk.qcow2",
} as const;

export interface MachineShape {
  accel: Accelerator;
  cpuModel: string;
  memoryMiB: number;
  vcpus: number;
  kernel: string;
  initrd: string;
  kernelCmdline: string;
  /** TCG only: the host TSC frequency, so the guest skips calibrating it. */
  tscKhz?: number;
  /** A virtio-net NIC; `vnetHdr` = with offloads, on a tap opened with IFF_VNET_HDR. */
  nic?: { mac: string; vnetHdr: boolean };
}

/** Per-instance parts of a machine: its files, and what its NIC (if the shape has one) is attached to. */
export interface MachineInstance {
  runDir: string;
  memoryFile: string;
  shared: boolean;
  disk: string;
  restoreFrom?: string;
  /** Default "none": the NIC has no peer (its frames go nowhere). */
  nicBackend?: "tap" | "none";
}

/** The machine of a child restored from a snapshot with `manifest`: the parent's shape, this instance's files. */
export function childSpec(manifest: SnapshotManifest, instance: MachineInstance): MachineSpec {
  return machineSpec(
    {
      accel: manifest.machine.accel,
      cpuModel: manifest.machine.cpu,
      memoryMiB: manifest.machine.memoryMiB,
      vcpus: manifest.machine.vcpus,
      kernel: manifest.image.kernel,
      initrd: manifest.image.initrd,
      kernelCmdline: manifest.machine.cmdline,
      tscKhz: manifest.machine.tscKhz ?? undefined,
      nic: manifest.machine.nic ?? undefined,
    },
    instance,
  );
}

/**
 * `FORKD_TCG_CACHE_MIB`: the TCG translation-cache size of every VM this process starts (default
 * `DEFAULT_TCG_TB_SIZE_MIB`). Host memory per child against host CPU per child; snapshots stay compatible.
 */
export function tcgCacheMiB(env: NodeJS.ProcessEnv = process.env): number | undefined {
  const raw = env.FORKD_TCG_CACHE_MIB;
  if (raw === undefined || raw === "") return undefined;
  const value = Number(raw);
  if (!/^\d+$/.test(raw) || value < 1 || value > MAX_TCG_TB_SIZE_MIB) {
    throw invalidArgument(
      `FORKD_TCG_CACHE_MIB must be an integer in 1..${MAX_TCG_TB_SIZE_MIB} (MiB), got ${JSON.stringify(raw)}`,
    );
  }
  return value;
}

export function machineSpec(shape: MachineShape, instance: MachineInstance): MachineSpec {
  return {
    accel: shape.accel,
    cpuModel: shape.cpuModel,
    memoryMiB: shape.memoryMiB,
    vcpus: shape.vcpus,
    kernel: shape.kernel,
    initrd: shape.initrd,
    kernelCmdline: shape.kernelCmdline,
    tscKhz: shape.tscKhz,
    tcgTbSizeMiB: tcgCacheMiB(),
    memoryFile: { path: instance.memoryFile, shared: instance.shared },
    disk: { overlayPath: instance.disk },
    agent: { socketPath: path.join(instance.runDir, RUN_FILES.agentSocket) },
    qmpSocketPath: path.join(instance.runDir, RUN_FILES.qmpSocket),
    consoleSocketPath: path.join(instance.runDir, RUN_FILES.consoleSocket),
    restore: instance.restoreFrom ? { deviceStatePath: instance.restoreFrom } : undefined,
    rng: true,
    nic: shape.nic
      ? { mac: shape.nic.mac, vnetHdr: shape.nic.vnetHdr, backend: instance.nicBackend ?? "none" }
      : undefined,
  };
}
