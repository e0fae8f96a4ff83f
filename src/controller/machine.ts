/**
 * The machine a template's parent and children run on. Everything here must be identical between a parent and
 * the children restored from it; per-instance paths are filled in by the caller.
 */
import path from "node:path";
import type { Accelerator, MachineSpec } from "../vmm/qemu-args.js";

/** Names of the files inside a snapshot directory. */
export const SNAPSHOT_FILES = {
  memory: "memory.bin",
  deviceState: "vmstate",
  disk: "disk.qcow2",
} as const;

/** Names of the files inside a VM's run directory. */
export const RUN_FILES = {
  agentSocket: "agent.sock",
  qmpSocket: "qmp.sock",
  console: "console.log",
  disk: "disk.qcow2",
} as const;

export function cpuModelFor(accel: Accelerator): string {
  // Under KVM the guest should see the host CPU; under TCG "max" gives the guest every feature QEMU emulates.
  return accel === "kvm" ? "host" : "max";
}

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
}

export function machineSpec(
  shape: MachineShape,
  instance: { runDir: string; memoryFile: string; shared: boolean; disk: string; restoreFrom?: string },
): MachineSpec {
  return {
    accel: shape.accel,
    cpuModel: shape.cpuModel,
    memoryMiB: shape.memoryMiB,
    vcpus: shape.vcpus,
    kernel: shape.kernel,
    initrd: shape.initrd,
    kernelCmdline: shape.kernelCmdline,
    tscKhz: shape.tscKhz,
    memoryFile: { path: instance.memoryFile, shared: instance.shared },
    disk: { overlayPath: instance.disk },
    agent: { socketPath: path.join(instance.runDir, RUN_FILES.agentSocket) },
    qmpSocketPath: path.join(instance.runDir, RUN_FILES.qmpSocket),
    consoleLogPath: path.join(instance.runDir, RUN_FILES.console),
    restore: instance.restoreFrom ? { deviceStatePath: instance.restoreFrom } : undefined,
    rng: true,
  };
}
