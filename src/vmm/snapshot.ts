/**
 * Snapshot primitives. A parent's RAM already lives in its `share=on` memory file, so a snapshot is only the
 * device state: `stop` + `xen-save-devices-state`. The restore side is `MachineSpec.restore` (the child gets the
 * file as fd 3 via `-incoming fd:3`, with the parent's memory file mapped `share=off`).
 *
 * What a restoring child needs, checked by experiment (test/vmm/snapshot.test.ts):
 * - the same machine and devices under the same ids (see RESTORE INVARIANT in qemu-args.ts), the parent's
 *   memory file with `shared: false`, and `-global migration.send-configuration=off` (buildQemuArgs adds it);
 * - nothing else: no `cont` (without -S it runs as soon as the load completes), no migration capabilities.
 * - the agent listener must exist before the child is spawned (launchVm does this). QEMU then connects the
 *   chardev before loading the state, the port's saved "host connected" state matches, and the guest sees no
 *   disconnect: the counter guest keeps its open count at 1 across the restore.
 * - `virtio-rng-device` survives the restore: the child's guest reads /dev/hwrng normally.
 */

import { randomBytes } from "node:crypto";
import fsp from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import type { QmpClient } from "./qmp.js";
import type { FileOwner } from "./unix-listener.js";

/**
 * Where QEMU writes a file for the host when it cannot reach the file's own directory: a confined QEMU sees
 * only its run directory, and can create nothing even there. The host makes the file there, hands it to
 * QEMU's uid, and moves it into place (root's again) once QEMU has written it.
 */
export interface QemuFileDrop {
  dir: string;
  owner: FileOwner;
}

/** A file for QEMU to write that becomes `target` (atomically) on `finish`, or nothing on `discard`. */
export interface QemuWrittenFile {
  /** The path to give QEMU. */
  path: string;
  /** Moves it to `target`; resolves with its size. */
  finish(): Promise<number>;
  discard(): Promise<void>;
}

export async function qemuWrittenFile(target: string, drop?: QemuFileDrop): Promise<QemuWrittenFile> {
  if (!path.isAbsolute(target)) {
    throw new ForkdError("invalid_argument", `device state path must be absolute: ${target}`);
  }
  const name = `.${path.basename(target)}.${randomBytes(4).toString("hex")}.partial`;
  if (!drop) {
    const partial = path.join(path.dirname(target), name);
    return {
      path: partial,
      finish: async () => {
        const { size } = await fsp.stat(partial);
        await fsp.rename(partial, target);
        return size;
      },
      discard: () => fsp.rm(partial, { force: true }),
    };
  }
  const dropped = path.join(drop.dir, name);
  const handle = await fsp.open(dropped, "wx", 0o600);
  await handle.close();
  await fsp.lchown(dropped, drop.owner.uid, drop.owner.gid);
  return {
    path: dropped,
    finish: async () => {
      await fsp.lchown(dropped, 0, 0);
      const { size } = await fsp.stat(dropped);
      // Run directories and snapshots live under one home, normally one filesystem.
      await fsp.rename(dropped, target).catch(async (err: NodeJS.ErrnoException) => {
        if (err.code !== "EXDEV") throw err;
        const partial = path.join(path.dirname(target), name);
        await fsp.copyFile(dropped, partial);
        await fsp.rename(partial, target);
        await fsp.rm(dropped, { force: true });
      });
      return size;
    },
    discard: () => fsp.rm(dropped, { force: true }),
  };
}

export interface SavedDeviceState {
  /** Wall time of stop + save, i.e. how long the guest was frozen for the snapshot. */
  ms: number;
  bytes: number;
}

/**
 * Stops the VM and writes its device state to `file` (atomically: a temp name in the same directory, renamed
 * when complete). The VM stays stopped: a `share=on` parent must never run again after this, or it would write
 * into the snapshot's RAM file.
 */
export async function saveDeviceState(
  qmp: QmpClient,
  file: string,
  options: { signal?: AbortSignal; drop?: QemuFileDrop } = {},
): Promise<SavedDeviceState> {
  const out = await qemuWrittenFile(file, options.drop);
  const started = performance.now();
  try {
    // Explicit stop first: xen-save-devices-state restarts a VM that was running when it was called.
    await qmp.execute("stop", undefined, options);
    await qmp.execute("xen-save-devices-state", { filename: out.path, live: false }, options);
    const ms = performance.now() - started;
    return { ms, bytes: await out.finish() };
  } catch (err) {
    await out.discard();
    throw err;
  }
}
