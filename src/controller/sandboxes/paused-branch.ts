/**
 * BRANCH (and fork) of a paused sandbox: its state is already a snapshot layer, so nothing is captured.
 *
 *   diff/live  a child of the pause layer that changes nothing: an empty memory layer, an empty disk overlay on
 *              the pause layer's disk, the same device state (hard-linked). Its children start exactly where
 *              the sandbox will when it resumes. The pause layer now has a dependent, so it stays (the rmi rules)
 *              even when the sandbox's later pauses merge it away.
 *   full       the pause layer's chain compacted into a snapshot that stands alone (snapshots/chains.ts).
 */
import { link } from "node:fs/promises";
import path from "node:path";
import { conflict, invalidArgument } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { MAX_CHAIN_DEPTH, manifestDigest, resolveChain } from "../../store/chain.js";
import type { StateDb } from "../../store/db.js";
import { writeMemoryLayerHashed } from "../../store/memory-layer.js";
import { SnapshotStore, type StoredSnapshot } from "../../store/snapshot-store.js";
import { createOverlay } from "../../vmm/qemu-tools.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import {
  type BranchMode,
  type BranchResult,
  DEFAULT_BRANCH_MODE,
  defaultBranchTag,
} from "../snapshots/branch.js";
import { compactSnapshot } from "../snapshots/chains.js";

export async function branchPausedState(
  paths: ForkdPaths,
  db: StateDb,
  request: {
    sandboxId: string;
    pauseTag: string;
    tag?: string;
    mode?: BranchMode;
    parentTag?: string;
    signal?: AbortSignal;
    /** The tenant owning the sandbox, whose the snapshot becomes (null: an admin's). */
    owner: string | null;
  },
): Promise<BranchResult> {
  const mode = request.mode ?? DEFAULT_BRANCH_MODE;
  if (mode !== "full" && mode !== "diff" && mode !== "live") {
    throw invalidArgument(`mode must be full, diff or live, got ${JSON.stringify(mode)}`);
  }
  if (request.parentTag !== undefined && request.parentTag !== request.pauseTag) {
    throw conflict(`parent_tag ${request.parentTag} does not match the sandbox's base ${request.pauseTag}`);
  }
  const store = new SnapshotStore(paths.snapshots);
  const tag = request.tag ?? defaultBranchTag(request.sandboxId);
  if (await store.exists(tag)) throw conflict(`snapshot ${JSON.stringify(tag)} already exists`);
  const claimed = db.claimSnapshotJob({
    tag,
    status: "writing",
    kind: `branch-${mode}`,
    started_at_unix: Math.floor(Date.now() / 1000),
    error: null,
    owner: request.owner,
  });
  if (!claimed) throw conflict(`snapshot ${JSON.stringify(tag)} is already being written`);
  try {
    const pause = await store.get(request.pauseTag);
    const ramBytes = pause.manifest.memory.ramBytes;
    let written: StoredSnapshot;
    if (mode === "full") {
      written = await compactSnapshot(paths, { from: request.pauseTag, to: tag, signal: request.signal });
    } else {
      const chain = await resolveChain(store, request.pauseTag);
      if (chain.length > MAX_CHAIN_DEPTH) {
        throw conflict(
          `snapshot ${request.pauseTag} is already ${chain.length - 1} layers deep; branch it with mode full`,
        );
      }
      written = await writeUnchangedLayer(store, pause, tag, request.sandboxId, mode, request.signal);
    }
    return {
      tag,
      mode,
      parent_tag: written.manifest.parent?.tag ?? null,
      status: "ready",
      pause_ms: 0,
      capture_ms: 0,
      bytes_captured: 0,
      ram_bytes: ramBytes,
      bytes_written: Object.values(written.manifest.files).reduce((n, f) => n + f.size, 0),
    };
  } finally {
    db.deleteSnapshotJob(tag);
  }
}

/** A layer on `parent` that changes nothing (see the module comment). */
async function writeUnchangedLayer(
  store: SnapshotStore,
  parent: StoredSnapshot,
  tag: string,
  sandboxId: string,
  mode: "diff" | "live",
  signal: AbortSignal | undefined,
): Promise<StoredSnapshot> {
  const ramBytes = parent.manifest.memory.ramBytes;
  const writer = await store.beginWrite(tag);
  try {
    await link(path.join(parent.dir, SNAPSHOT_FILES.deviceState), writer.file(SNAPSHOT_FILES.deviceState));
    await createOverlay({
      backing: path.join("..", "..", "snapshots", parent.tag, SNAPSHOT_FILES.disk),
      backingFormat: "qcow2",
      overlay: writer.file(SNAPSHOT_FILES.disk),
    });
    const memory = await writeMemoryLayerHashed(
      writer.file(SNAPSHOT_FILES.memoryLayer),
      ramBytes,
      new Uint32Array(0),
      Buffer.alloc(0),
    );
    const { format: _f, tag: _t, files, createdAtUnix: _c, ...rest } = parent.manifest;
    await writer.commit(
      {
        ...rest,
        parent: { tag: parent.tag, manifestSha256: await manifestDigest(parent) },
        memory: { format: "layer", ramBytes, pages: 0 },
        origin: { kind: "branch", mode, sourceSandbox: sandboxId, pauseMs: 0 },
        timings: { bootMs: 0, warmupMs: 0, saveMs: 0 },
      },
      [SNAPSHOT_FILES.memoryLayer, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
      signal,
      {
        [SNAPSHOT_FILES.memoryLayer]: memory,
        ...(files[SNAPSHOT_FILES.deviceState]
          ? { [SNAPSHOT_FILES.deviceState]: files[SNAPSHOT_FILES.deviceState] }
          : {}),
      },
    );
  } finally {
    await writer.abort();
  }
  return store.get(tag);
}
