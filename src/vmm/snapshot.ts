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
  options: { signal?: AbortSignal } = {},
): Promise<SavedDeviceState> {
  if (!path.isAbsolute(file))
    throw new ForkdError("invalid_argument", `device state path must be absolute: ${file}`);
  const partial = path.join(
    path.dirname(file),
    `.${path.basename(file)}.${randomBytes(4).toString("hex")}.partial`,
  );
  const started = performance.now();
  try {
    // Explicit stop first: xen-save-devices-state restarts a VM that was running when it was called.
    await qmp.execute("stop", undefined, options);
    await qmp.execute("xen-save-devices-state", { filename: partial, live: false }, options);
    const ms = performance.now() - started;
    const { size } = await fsp.stat(partial);
    await fsp.rename(partial, file);
    return { ms, bytes: size };
  } catch (err) {
    await fsp.rm(partial, { force: true });
    throw err;
  }
}
