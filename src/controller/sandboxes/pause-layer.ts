/**
 * Pause: a running sandbox's state written as a snapshot layer, like a diff BRANCH, except that the VM does not
 * run again (the caller kills it once the database says paused, which frees its RAM):
 *
 *   stop                 QMP `stop` drains and flushes the disk
 *   capture              device state, the private pages (what the VM wrote since its restore, read with
 *                        process_vm_readv), both while stopped; stop-and-copy even for a live_fork (shmem)
 *                        sandbox: QEMU's background snapshot only pays off when the guest must keep running, and
 *                        it streams all of RAM through a socket, several times slower than this copy
 *   memory.layer         only the pages that differ from the parent's RAM (snapshots/chain-ram.ts)
 *   disk.qcow2           the VM's writable overlay itself, hard-linked (QEMU is stopped and never writes it
 *                        again); its backing file is already the parent's layer
 *   vmstate              from `xen-save-devices-state`
 *
 * The parent is the sandbox's previous pause layer (or BRANCH, or the snapshot it was spawned from), so a
 * pause writes only what changed since the sandbox last ran. When its own pause layers start to cost more disk
 * than what they hold (they repeat pages: MERGE_SLACK) or the chain gets deep (MAX_OWN_PAUSE_LAYERS), the pause
 * writes one merged layer instead, relative to the layer below its own ones: every page that differs from that
 * layer, and its disk overlays folded onto that layer's disk (snapshots/flat-disk.ts, as compaction does). Then the
 * older own layers are no longer part of its chain and go (the caller deletes them by the rmi rules). Repeated cycles
 * therefore keep the chain depth, the disk and the resume time bounded.
 *
 * If anything fails before the layer is published, the VM is continued: the sandbox keeps running, nothing of
 * the attempt is left (the staging directory is removed). After that point the pause always completes (a
 * crashed daemon finishes it at start-up: the layer shares its disk file with the stopped VM, so the VM must
 * never run again).
 */
import { randomBytes } from "node:crypto";
import { lchown, link, stat } from "node:fs/promises";
import path from "node:path";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, ForkdError } from "../../common/errors.js";
import { MAX_CHAIN_DEPTH, manifestDigest, resolveChain } from "../../store/chain.js";
import type { SnapshotManifest } from "../../store/manifest.js";
import { PAGE_SIZE, readLayerIndex, writeMemoryLayerHashed } from "../../store/memory-layer.js";
import { readQcow2Header } from "../../store/qcow2-header.js";
import type { SnapshotStore, SnapshotWriter, StoredSnapshot } from "../../store/snapshot-store.js";
import { diskTop } from "../../vmm/disk-layers.js";
import { findGuestRamMapping, scanPrivatePages } from "../../vmm/guest-memory.js";
import type { QmpClient } from "../../vmm/qmp.js";
import { captureStopped } from "../../vmm/stopped-capture.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";
import { changedIndices, packInPlace } from "../snapshots/chain-ram.js";
import { writeDiskOnLayer } from "../snapshots/flat-disk.js";

/** Own pause layers a sandbox's chain may hold before its next pause merges them. */
export const MAX_OWN_PAUSE_LAYERS = 4;
/** Merge when the own layers plus the new one hold more than this times the pages the sandbox has changed. */
export const MERGE_SLACK = 1.1;
/** Extra pages the capture buffer holds beyond the estimate taken before the stop (16 MiB). */
const CAPTURE_HEADROOM_PAGES = 4096;

type StoppedCapture = Awaited<ReturnType<typeof captureStopped>>;

export type MergePolicy = "auto" | "always";

export interface PauseSource {
  handle: SandboxHandle;
  /** What its state builds on: its latest pause or BRANCH, else the snapshot it was spawned from. */
  parentTag: string;
  /** Its own pause layers at the top of its chain, bottom first (the last one is `parentTag` when any). */
  ownLayers: readonly string[];
}

export interface PausedLayer {
  tag: string;
  parentTag: string;
  /** The own layers merged into this one (no longer in the sandbox's chain). */
  replaced: string[];
  /** Stop to the end of the copy out of the VM. */
  pause_ms: number;
  /** Stop to the layer published. */
  write_ms: number;
  /** Pages the VM had written since its restore, bytes. */
  bytes_captured: number;
  /** Pages in the new layer (those that differ from its parent). */
  pages: number;
  ram_bytes: number;
}

export function pauseLayerTag(sandboxId: string): string {
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "-");
  return `pause-${sandboxId}-${stamp}-${randomBytes(2).toString("hex")}`;
}

/**
 * Stops the VM and publishes its state as snapshot `tag`. Returns with the VM stopped (kill it); on failure the
 * VM runs again and nothing is left.
 */
export async function writePauseLayer(
  store: SnapshotStore,
  source: PauseSource,
  options: { tag: string; merge?: MergePolicy; signal?: AbortSignal },
): Promise<PausedLayer> {
  const { handle } = source;
  const { signal } = options;
  const layers = await pauseChain(store, source);
  const { ownManifests, parent } = layers;
  const ramBytes = parent.manifest.memory.ramBytes;
  const qmp = await handle.qmp();
  const top = await diskTop(qmp, { signal });
  await checkTopBacking(top.file, source.parentTag);
  const writer = await store.beginWrite(options.tag, {
    expectedBytes: ramBytes + (await foldBytes(top.file, ownManifests)),
  });
  const started = performance.now();
  let stopped = false;
  try {
    const captured = await captureLeavingStopped(
      handle,
      qmp,
      ramBytes,
      writer.file(SNAPSHOT_FILES.deviceState),
      {
        onStopped: () => {
          stopped = true;
          crashPoint("pause.stopped");
        },
        signal,
      },
    );
    const { merge, layerParent, memory } = await planPauseLayer(store, {
      ...layers,
      handle,
      captured,
      policy: options.merge,
    });
    const hashed = await writeLayerFiles(writer, {
      topFile: top.file,
      mergeOnto: merge ? layerParent.tag : null,
      handle,
      signal,
      ramBytes,
      memory,
    });
    crashPoint("pause.captured");
    const pauseMs = captured.pauseMs;
    await writer.commit(
      pauseManifest(layerParent, {
        parent: { tag: layerParent.tag, manifestSha256: await manifestDigest(layerParent) },
        memory: { format: "layer", ramBytes, pages: memory.pages.length },
        origin: { kind: "pause", mode: "diff", sourceSandbox: handle.id, pauseMs: round1(pauseMs) },
      }),
      [SNAPSHOT_FILES.memoryLayer, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
      signal,
      { [SNAPSHOT_FILES.memoryLayer]: hashed },
    );
    crashPoint("pause.published");
    return {
      tag: options.tag,
      parentTag: layerParent.tag,
      replaced: merge ? [...source.ownLayers] : [],
      pause_ms: round1(pauseMs),
      write_ms: round1(performance.now() - started),
      bytes_captured: captured.pages.length * PAGE_SIZE,
      pages: memory.pages.length,
      ram_bytes: ramBytes,
    };
  } catch (err) {
    await writer.abort();
    // Not published: the sandbox goes on running as if nothing happened.
    if (stopped) await qmp.execute("cont").catch(() => {});
    throw err;
  }
}

/** Bytes a pause may add beyond RAM: for a merge, a copy of the overlay and of what the own layers' disks hold. */
async function foldBytes(topFile: string, ownManifests: readonly StoredSnapshot[]): Promise<number> {
  return (
    (await stat(topFile)).blocks * 512 +
    ownManifests.reduce((n, s) => n + (s.manifest.files[SNAPSHOT_FILES.disk]?.size ?? 0), 0)
  );
}

/**
 * Writes the layer's disk and memory layer; returns the memory layer's digest. The disk layer (a fold runs child
 * processes) and the memory layer's write-out overlap; the disk's starts first, since hashing the memory layer
 * holds this thread. Both settle before anything is aborted.
 */
async function writeLayerFiles(
  writer: SnapshotWriter,
  layer: Parameters<typeof writeLayerDisk>[1] & {
    ramBytes: number;
    memory: { pages: Uint32Array; data: Buffer };
  },
) {
  const { ramBytes, memory } = layer;
  const disk = writeLayerDisk(writer, layer);
  const [diskDone, memoryDone] = await Promise.allSettled([
    disk,
    writeMemoryLayerHashed(writer.file(SNAPSHOT_FILES.memoryLayer), ramBytes, memory.pages, memory.data),
  ]);
  if (diskDone.status === "rejected") throw diskDone.reason;
  if (memoryDone.status === "rejected") throw memoryDone.reason;
  return memoryDone.value;
}

/** What a pause of `source` builds on: its chain, its own pause layers, and where a merge would put the layer. */
async function pauseChain(store: SnapshotStore, source: PauseSource) {
  const chain = await resolveChain(store, source.parentTag);
  const ownManifests = await Promise.all(source.ownLayers.map((t) => store.get(t)));
  const base = mergeBase(ownManifests);
  // A layer on this parent would be one too many: merge (which never deepens the chain), or refuse.
  const tooDeep = chain.length > MAX_CHAIN_DEPTH;
  if (tooDeep && base === null) {
    throw conflict(
      `snapshot ${source.parentTag} is already ${chain.length - 1} layers deep; its sandboxes cannot be paused (compact it)`,
    );
  }
  return { chain, ownManifests, base, tooDeep, parent: chain[chain.length - 1] as StoredSnapshot };
}

/**
 * The layer's disk: the VM's overlay itself, hard-linked (QEMU is stopped and never writes it again), or, for a
 * merge, the overlay and the own layers' disks folded onto the disk of the layer it goes on.
 */
async function writeLayerDisk(
  writer: SnapshotWriter,
  layer: {
    topFile: string;
    mergeOnto: string | null;
    handle: SandboxHandle;
    signal: AbortSignal | undefined;
  },
): Promise<void> {
  if (layer.mergeOnto !== null) {
    await writeDiskOnLayer({
      topLayer: layer.topFile,
      baseTag: layer.mergeOnto,
      snapshotDir: writer,
      signal: layer.signal,
    });
    return;
  }
  await link(layer.topFile, writer.file(SNAPSHOT_FILES.disk));
  // The VM never runs again on this file: from now on it is a snapshot layer, root's (not the VM's uid).
  if (layer.handle.vmOwner) await lchown(writer.file(SNAPSHOT_FILES.disk), 0, 0);
}

/** Pages the VM wrote since its restore, and its device state, copied while it is stopped; it stays stopped. */
async function captureLeavingStopped(
  handle: SandboxHandle,
  qmp: QmpClient,
  ramBytes: number,
  deviceStatePath: string,
  options: { onStopped: () => void; signal: AbortSignal | undefined },
): Promise<StoppedCapture> {
  const mapping = findGuestRamMapping(handle.pid, handle.memoryImage, { expectedBytes: ramBytes });
  // Touched before the stop, so the copy inside it takes no page faults on its destination.
  const estimate = scanPrivatePages(mapping).pages.length;
  const buffer = Buffer.alloc((estimate + CAPTURE_HEADROOM_PAGES) * PAGE_SIZE);
  return captureStopped({
    qmp,
    pid: handle.pid,
    memoryFile: handle.memoryImage,
    memoryBytes: ramBytes,
    deviceStatePath,
    // A confined QEMU cannot see the snapshot store: it writes into its run directory, moved in afterwards.
    deviceStateDrop: handle.vmOwner ? { dir: handle.runDir, owner: handle.vmOwner } : undefined,
    whileStopped: async () => options.onStopped(),
    buffer,
    leaveStopped: true,
    signal: options.signal,
  });
}

/**
 * What the new layer sits on and holds: the sandbox's parent and the pages that differ from it, or, merging,
 * the layer below its own pause layers and every page that may differ from that (when asked to, when the chain
 * is too deep, when it has MAX_OWN_PAUSE_LAYERS, or when its own layers repeat pages: MERGE_SLACK).
 *
 * One comparison pass, against the parent. A merged layer needs no second pass against the layer below: where
 * no own layer holds a page, the parent's content of it is that layer's, so the pages that differ from the parent
 * are exactly the ones that differ from it; a page an own layer holds is kept as the VM has it (its content is
 * then right whether or not it still differs from the layer below: a page too many, never one too few).
 */
async function planPauseLayer(
  store: SnapshotStore,
  state: {
    chain: StoredSnapshot[];
    ownManifests: StoredSnapshot[];
    base: string | null;
    tooDeep: boolean;
    handle: SandboxHandle;
    captured: StoppedCapture;
    policy: MergePolicy | undefined;
  },
): Promise<{ merge: boolean; layerParent: StoredSnapshot; memory: { pages: Uint32Array; data: Buffer } }> {
  const { chain, ownManifests, base, handle, captured } = state;
  const parent = chain[chain.length - 1] as StoredSnapshot;
  const changed = await changedIndices(chain, handle.snapshotTag, handle.memoryImage, captured);
  const ownPages = ownManifests.reduce((n, s) => n + s.manifest.memory.pages, 0);
  const merge =
    base !== null &&
    (state.policy === "always" ||
      state.tooDeep ||
      ownManifests.length >= MAX_OWN_PAUSE_LAYERS ||
      ownPages + changed.length > MERGE_SLACK * captured.pages.length);
  if (!merge || !base) return { merge: false, layerParent: parent, memory: packInPlace(captured, changed) };
  const keep = keptForMerge(captured.pages, changed, await ownLayerPages(ownManifests));
  return { merge, layerParent: await store.get(base), memory: packInPlace(captured, keep) };
}

/** Every page the sandbox's own pause layers hold (sorted, without repeats). */
async function ownLayerPages(own: StoredSnapshot[]): Promise<Uint32Array> {
  const all = new Set<number>();
  for (const layer of own) {
    const { pages } = await readLayerIndex(path.join(layer.dir, SNAPSHOT_FILES.memoryLayer));
    for (const page of pages) all.add(page);
  }
  return Uint32Array.from(all).sort();
}

/**
 * Indices of the captured pages (ascending page numbers) to keep in a merged layer: those in `changed` (indices,
 * ascending) and those whose page is in `held` (page numbers, ascending).
 */
export function keptForMerge(pages: Uint32Array, changed: Uint32Array, held: Uint32Array): Uint32Array {
  const keep = new Uint32Array(pages.length);
  let count = 0;
  let c = 0;
  let h = 0;
  for (let i = 0; i < pages.length; i++) {
    const page = pages[i] as number;
    while (c < changed.length && (changed[c] as number) < i) c++;
    while (h < held.length && (held[h] as number) < page) h++;
    if (changed[c] === i || held[h] === page) keep[count++] = i;
  }
  return keep.subarray(0, count);
}

/**
 * Where a merge puts the new layer: below the sandbox's own pause layers (null when it has none). The chain
 * must leave room for it (a merge never deepens it).
 */
function mergeBase(own: StoredSnapshot[]): string | null {
  const bottom = own[0];
  if (!bottom) return null;
  const below = bottom.manifest.parent?.tag;
  if (below === undefined) throw new ForkdError("internal", `pause layer ${bottom.tag} has no parent`);
  return below;
}

/** The VM's overlay must read through to the parent's disk layer, or linking it would make a wrong snapshot. */
async function checkTopBacking(topFile: string, parentTag: string): Promise<void> {
  const header = await readQcow2Header(topFile, "the sandbox's disk overlay");
  const expected = path.join("..", "..", "snapshots", parentTag, SNAPSHOT_FILES.disk);
  if (header.backingFile !== expected) {
    throw conflict(
      `the sandbox's disk overlay reads through to ${header.backingFile ?? "nothing"}, not ${expected}; it cannot be paused`,
    );
  }
}

function pauseManifest(
  parent: StoredSnapshot,
  fields: Pick<SnapshotManifest, "parent" | "memory" | "origin">,
): Omit<SnapshotManifest, "format" | "tag" | "files" | "createdAtUnix"> {
  return {
    template: parent.manifest.template,
    image: parent.manifest.image,
    machine: parent.manifest.machine,
    timings: { bootMs: 0, warmupMs: 0, saveMs: fields.origin.pauseMs ?? 0 },
    ...fields,
  };
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
