/** Listing and deleting snapshots (the store keeps them; this is the controller's view for CLI and API). */
import type { ForkdPaths } from "../../common/paths.js";
import { SnapshotStore } from "../../store/snapshot-store.js";

export interface SnapshotSummary {
  tag: string;
  template: string;
  accel: "kvm" | "tcg";
  memory_mib: number;
  created_at_unix: number;
  parent_tag: string | null;
  bytes: number;
}

export async function listSnapshots(paths: ForkdPaths): Promise<SnapshotSummary[]> {
  const store = new SnapshotStore(paths.snapshots);
  return (await store.list()).map(({ tag, manifest }) => ({
    tag,
    template: manifest.template.name,
    accel: manifest.machine.accel,
    memory_mib: manifest.machine.memoryMiB,
    created_at_unix: manifest.createdAtUnix,
    parent_tag: manifest.parent?.tag ?? null,
    bytes: Object.values(manifest.files).reduce((sum, f) => sum + f.size, 0),
  }));
}
