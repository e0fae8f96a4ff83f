/**
 * How every VM forkd starts is launched: a sandbox, a snapshot's parent, the accelerator probe and the
 * cold-boot baseline all go through the same launcher with the same confinement (isolation/confinement.ts),
 * plus what each needs of its own: its NIC's namespace and tap, its cgroups, a cap on what it writes, the
 * files it may read.
 */
import { lstat } from "node:fs/promises";
import path from "node:path";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import { vmUidOf } from "../../isolation/identity.js";
import { type LaunchPlan, launcherPrefix, readOnlyRamPreload } from "../../isolation/launcher.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import { type MachineSpec, QMP_FD } from "../../vmm/qemu-args.js";
import type { FileOwner } from "../../vmm/unix-listener.js";
import type { NicAttachment } from "../networks/sandbox-networks.js";
import { SNAPSHOT_FILES } from "./machine.js";

export interface VmLaunch {
  spec: MachineSpec;
  runDir: string;
  /**
   * Files QEMU reads besides those the spec names (its disk's backing chain); a symlink is kept, and what it
   * points to is readable too.
   */
  readOnly?: readonly string[];
  nic?: NicAttachment;
  /** Inherited fds QEMU keeps (the device state's). */
  keepFds?: readonly number[];
  cgroups?: readonly string[];
  /** RLIMIT_FSIZE: the cap on the VM's writable disk layer. */
  fileSizeLimitBytes?: number;
  /** Kill QEMU when this process exits (a VM that must not outlive its daemon or CLI). */
  dieWithParent: boolean;
}

/**
 * `spec` as `confinement` runs it: with QEMU's seccomp sandbox, and (with a uid of its own) its monitor on a
 * socket the launcher binds, so QEMU creates no file at all.
 */
export function confineSpec(confinement: ConfinementConfig, spec: MachineSpec): MachineSpec {
  return {
    ...spec,
    seccomp: confinement.seccomp,
    qmpFd: confinement.uids ? QMP_FD : undefined,
  };
}

export interface VmStart {
  /** The launcher and its arguments (undefined: QEMU is started directly). */
  prefix: string[] | undefined;
  /** Added to QEMU's environment. */
  env: Record<string, string> | undefined;
}

/** How to start the VM of `launch` (its spec from `confineSpec`) under `confinement`. */
export function vmStart(confinement: ConfinementConfig, launch: VmLaunch): VmStart {
  let env: Record<string, string> | undefined;
  const plan: LaunchPlan = {
    ...(launch.nic?.launch ?? {}),
    keepFds: launch.keepFds,
    cgroups: launch.cgroups?.length ? launch.cgroups : undefined,
    fileSizeLimitBytes: launch.fileSizeLimitBytes,
    dieWithParent: launch.dieWithParent,
  };
  if (confinement.uids) {
    const { spec } = launch;
    // What QEMU writes: the sockets it connects to, its disk overlay, a parent's shared RAM file.
    const own = [spec.consoleSocketPath];
    if (spec.agent) own.push(spec.agent.socketPath);
    if (spec.disk) own.push(spec.disk.overlayPath);
    const readOnly = [...(launch.readOnly ?? [])];
    const libraries: string[] = [];
    if (spec.memoryFile?.shared) own.push(spec.memoryFile.path);
    else if (spec.memoryFile) {
      // A child's RAM image is every sibling's too: QEMU gets it read-only (see isolation/ro-ram/ro-ram.c).
      readOnly.push(spec.memoryFile.path);
      const preload = readOnlyRamPreload([spec.memoryFile.path]);
      libraries.push(preload.library);
      env = preload.env;
    }
    // A restored child never boots, so it needs no kernel (see qemu-args.ts).
    if (!spec.restore) readOnly.push(spec.kernel, spec.initrd);
    if (spec.qmpFd !== undefined) plan.listen = { path: spec.qmpSocketPath, fd: spec.qmpFd };
    plan.confine = {
      uidBase: confinement.uids.base,
      runDir: launch.runDir,
      own,
      readOnly,
      libraries,
      devices: spec.accel === "kvm" ? ["kvm"] : [],
    };
  }
  const needed =
    plan.netns !== undefined ||
    plan.confine !== undefined ||
    plan.cgroups !== undefined ||
    plan.fileSizeLimitBytes !== undefined ||
    plan.dieWithParent === true;
  return { prefix: needed ? launcherPrefix(plan) : undefined, env };
}

/** The uid/gid a VM with `pid` runs as under `confinement`, or null when it runs as this process's user. */
export function vmOwner(confinement: ConfinementConfig, pid: number): FileOwner | null {
  if (!confinement.uids) return null;
  const uid = vmUidOf(confinement.uids, pid);
  return { uid, gid: uid };
}

/** What a child of `chain` reads besides its memory image: every disk layer and the image's root filesystem. */
export async function chainDiskFiles(chain: readonly StoredSnapshot[]): Promise<string[]> {
  const files: string[] = [];
  for (const snapshot of chain) {
    files.push(path.join(snapshot.dir, SNAPSHOT_FILES.disk));
    const base = path.join(snapshot.dir, SNAPSHOT_FILES.baseDisk);
    if (
      await lstat(base).then(
        () => true,
        () => false,
      )
    )
      files.push(base);
  }
  return files;
}
