/**
 * Managing snapshot chains: what a chain is made of and what it costs on disk (snapshot-info), deleting
 * snapshots without pulling layers from under their dependents or running sandboxes (rmi), and folding a chain
 * into one flat snapshot (compact).
 */

import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFile, readdir, readFile, readlink, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { MAX_CHAIN_DEPTH, manifestDigest, resolveChain } from "../../store/chain.js";
import { MANIFEST_FILE } from "../../store/manifest.js";
import { flatImageFor, removeAssembledImage } from "../../store/memory-images.js";
import { PAGE_SIZE } from "../../store/memory-layer.js";
import { readQcow2Header } from "../../store/qcow2-header.js";
import { SnapshotStore, type StoredSnapshot } from "../../store/snapshot-store.js";
import { FileVerifier } from "../../store/verify.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import {
  cacheDirs,
  memoryImageOptions,
  snapshotIsBootable,
  verifyChainFiles,
} from "../machines/restore-plan.js";
import type { ChainDetail, LayerUsage, SnapshotDetail, SnapshotInfo } from "../sandbox-service.js";
import { writeFlatDisk } from "./flat-disk.js";

const execFileAsync = promisify(execFile);

// ---- the snapshot graph ----

/** Every readable snapshot and who depends on whom. */
export interface SnapshotGraph {
  byTag: Map<string, StoredSnapshot>;
  /** Direct dependents of each tag (including tags that no longer exist: orphans point at them). */
  children: Map<string, string[]>;
}

export async function loadGraph(store: SnapshotStore): Promise<SnapshotGraph> {
  const all = await store.list();
  const byTag = new Map(all.map((s) => [s.tag, s]));
  const children = new Map<string, string[]>();
  for (const s of all) {
    const parent = s.manifest.parent?.tag;
    if (parent === undefined) continue;
    children.set(parent, [...(children.get(parent) ?? []), s.tag]);
  }
  return { byTag, children };
}

/** Every snapshot that depends on `tag` directly or through others, parents before their children. */
export function descendantsOf(graph: SnapshotGraph, tag: string): string[] {
  const out: string[] = [];
  const seen = new Set([tag]);
  const queue = [tag];
  while (queue.length > 0) {
    for (const child of graph.children.get(queue.shift() as string) ?? []) {
      if (seen.has(child)) continue;
      seen.add(child);
      out.push(child);
      queue.push(child);
    }
  }
  return out;
}

/** Every snapshot on disk that depends on `tag` (which need not exist any more: orphans still name it). */
export async function snapshotDescendants(paths: ForkdPaths, tag: string): Promise<string[]> {
  return descendantsOf(await loadGraph(new SnapshotStore(paths.snapshots)), assertTag(tag));
}

// ---- snapshot-info ----

export async function chainDetail(paths: ForkdPaths, tag: string): Promise<ChainDetail> {
  assertTag(tag);
  const store = new SnapshotStore(paths.snapshots);
  const head = await store.get(tag);
  const graph = await loadGraph(store);
  let chainError: string | null = null;
  try {
    await resolveChain(store, tag);
  } catch (err) {
    chainError = errorMessage(err);
  }
  // Followed leniently (resolveChain above says what is wrong), so a broken chain still shows what exists.
  const chain: StoredSnapshot[] = [head];
  for (let s = head; s.manifest.parent && chain.length <= MAX_CHAIN_DEPTH + 1; ) {
    const parent = graph.byTag.get(s.manifest.parent.tag);
    if (!parent || chain.includes(parent)) break;
    chain.unshift(parent);
    s = parent;
  }
  const layers = await Promise.all(chain.map(layerUsage));
  const own = layers[layers.length - 1] as LayerUsage;
  return {
    tag,
    chain_depth: chainError === null ? chain.length - 1 : depthOf(head, graph),
    parent_tag: head.manifest.parent?.tag ?? null,
    parent_content_hash: head.manifest.parent?.manifestSha256 ?? null,
    ancestors: chain.slice(0, -1).map((s) => s.tag),
    dependents: graph.children.get(tag) ?? [],
    all_dependents: descendantsOf(graph, tag),
    layers,
    chain_bytes: {
      memory_physical: sum(layers.slice(lastFlat(layers)).map((l) => l.memory)),
      disk_physical: sum(layers.map((l) => l.disk)),
      vmstate: own.vmstate_bytes,
    },
    memory_logical_bytes: own.memory.logical_bytes,
    memory_physical_bytes: own.memory.physical_bytes,
    vmstate_bytes: own.vmstate_bytes,
    chain_error: chainError,
  };
}

/**
 * `chainDetail` plus the snapshot's summary, for the CLI without a daemon (the daemon's DaemonSnapshots.detail
 * adds its own view: snapshots being written or failed).
 */
export async function localSnapshotDetail(
  paths: ForkdPaths,
  tag: string,
): Promise<SnapshotDetail & { dir: string }> {
  const { tag: _tag, parent_tag: parentTag, ...chain } = await chainDetail(paths, tag);
  const store = new SnapshotStore(paths.snapshots);
  const s = await store.get(tag);
  const problem = await snapshotIsBootable(s);
  return {
    tag,
    dir: s.dir,
    created_at_unix: s.manifest.createdAtUnix,
    status: "ready",
    bootable: problem === null && chain.chain_error === null,
    template: s.manifest.template.name,
    accelerator: s.manifest.machine.accel,
    memory_mib: s.manifest.machine.memoryMiB,
    parent_tag: parentTag,
    bytes: Object.values(s.manifest.files).reduce((n, f) => n + f.size, 0),
    error: problem,
    vcpus: s.manifest.machine.vcpus,
    source_sandbox: s.manifest.origin.sourceSandbox,
    // Aliases, owners and the daemon's own snapshots are the daemon's records; the CLI alone does not read them.
    aliases: [],
    ephemeral: false,
    owner: null,
    ...(await originFacts(s)),
    egress_default: s.manifest.template.egress ?? null,
    ...chain,
  };
}

/** The chain fields of a snapshot that is not (yet) on disk: being written, or failed. */
export function emptyChainDetail(): Omit<ChainDetail, "tag" | "parent_tag"> {
  return {
    chain_depth: 0,
    parent_content_hash: null,
    ancestors: [],
    dependents: [],
    all_dependents: [],
    layers: [],
    chain_bytes: { memory_physical: 0, disk_physical: 0, vmstate: 0 },
    memory_logical_bytes: 0,
    memory_physical_bytes: 0,
    vmstate_bytes: 0,
    chain_error: null,
  };
}

function depthOf(head: StoredSnapshot, graph: SnapshotGraph): number {
  let depth = 0;
  const seen = new Set<string>();
  for (let p = head.manifest.parent?.tag; p !== undefined && !seen.has(p); depth++) {
    seen.add(p);
    p = graph.byTag.get(p)?.manifest.parent?.tag;
  }
  return depth;
}

/** Children's RAM comes from the nearest flat layer below the head plus the layers above it. */
function lastFlat(layers: LayerUsage[]): number {
  for (let i = layers.length - 1; i >= 0; i--) if (layers[i]?.memory.format === "flat") return i;
  return 0;
}

function sum(parts: { physical_bytes: number }[]): number {
  return parts.reduce((total, p) => total + p.physical_bytes, 0);
}

async function layerUsage(s: StoredSnapshot): Promise<LayerUsage> {
  const memoryName = s.manifest.memory.format === "flat" ? SNAPSHOT_FILES.memory : SNAPSHOT_FILES.memoryLayer;
  const diskFile = path.join(s.dir, SNAPSHOT_FILES.disk);
  const header = await readQcow2Header(diskFile, `snapshot ${s.tag}`).catch(() => null);
  return {
    tag: s.tag,
    origin: s.manifest.origin.kind,
    memory: {
      format: s.manifest.memory.format,
      pages: s.manifest.memory.pages,
      logical_bytes: s.manifest.memory.ramBytes,
      physical_bytes: await physicalBytes(path.join(s.dir, memoryName)),
    },
    disk: {
      logical_bytes: header?.virtualSize ?? 0,
      physical_bytes: await physicalBytes(diskFile),
      backing: header?.backingFile ?? null,
    },
    vmstate_bytes: (await stat(path.join(s.dir, SNAPSHOT_FILES.deviceState)).catch(() => null))?.size ?? 0,
  };
}

/** How a stored snapshot came to be and what its own files occupy on disk (SnapshotInfo's origin fields). */
export async function originFacts(
  s: StoredSnapshot,
): Promise<Pick<SnapshotInfo, "origin" | "branch_mode" | "disk_bytes">> {
  const sizes = await Promise.all(
    Object.keys(s.manifest.files).map((name) => physicalBytes(path.join(s.dir, name))),
  );
  return {
    origin: s.manifest.origin.kind,
    branch_mode: s.manifest.origin.kind === "branch" ? s.manifest.origin.mode : null,
    disk_bytes: sizes.reduce((sum, n) => sum + n, 0),
  };
}

async function physicalBytes(file: string): Promise<number> {
  const st = await stat(file).catch(() => null);
  return st ? st.blocks * 512 : 0;
}

// ---- what is in use ----

export interface RemoveOptions {
  /** Delete everything that depends on the snapshot too (leaves first). */
  cascade?: boolean;
  /** Delete the snapshot and leave its dependents orphaned (unbootable until deleted). */
  force?: boolean;
  /**
   * Sandboxes the daemon knows to depend on `tag` (restored from it, or running on a layer branched from it).
   * The CLI without a daemon has no such record; the process scan below covers it.
   */
  sandboxesOf?: (tag: string) => string[];
}

/**
 * QEMU processes that have a file of one of `tags` open or mapped: its snapshot directory's files (disk layers
 * are opened as backing files by every child of a descendant) or its assembled RAM image. This catches VMs no
 * daemon record knows about: `forkd fork` children, a daemon's sandboxes seen from the CLI, branch sources.
 */
export async function qemusUsing(paths: ForkdPaths, tags: string[]): Promise<Map<string, number[]>> {
  const dirs = cacheDirs(paths);
  const owners: { prefix: string; tag: string }[] = [];
  for (const tag of tags) {
    owners.push({ prefix: `${path.join(paths.snapshots, tag)}/`, tag });
    for (const dir of [dirs.cacheDir, dirs.tmpfsDir]) owners.push({ prefix: `${path.join(dir, tag)}-`, tag });
  }
  const ownerOf = (file: string): string | undefined => {
    for (const { prefix, tag } of owners) {
      if (!file.startsWith(prefix)) continue;
      // Assembled images are <tag>-<32 hex>.bin: make sure "a-" does not claim tag "a-b"'s image.
      if (prefix.endsWith("-") && !/^[0-9a-f]{32}\.bin( \(deleted\))?$/.test(file.slice(prefix.length)))
        continue;
      return tag;
    }
    return undefined;
  };
  const found = new Map<string, number[]>();
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const comm = await readFile(`/proc/${entry}/comm`, "utf8").catch(() => "");
    if (!comm.startsWith("qemu-system")) continue;
    const files = new Set<string>();
    const fdDir = `/proc/${entry}/fd`;
    for (const fd of await readdir(fdDir).catch(() => [] as string[])) {
      const target = await readlink(path.join(fdDir, fd)).catch(() => null);
      if (target) files.add(target);
    }
    const maps = await readFile(`/proc/${entry}/maps`, "utf8").catch(() => "");
    for (const line of maps.split("\n")) {
      const at = line.indexOf("/");
      if (at > 0) files.add(line.slice(at));
    }
    for (const file of files) {
      const tag = ownerOf(file);
      if (tag === undefined) continue;
      const pids = found.get(tag) ?? [];
      if (!pids.includes(Number(entry))) pids.push(Number(entry));
      found.set(tag, pids);
    }
  }
  return found;
}

/** Throws `conflict` naming who uses them if a running VM depends on any of `tags`. */
async function assertUnused(paths: ForkdPaths, tags: string[], options: RemoveOptions): Promise<void> {
  const problems: string[] = [];
  const sandboxes = new Set<string>();
  for (const tag of tags) {
    const users = options.sandboxesOf?.(tag) ?? [];
    for (const id of users) sandboxes.add(id);
    if (users.length > 0)
      problems.push(`${tag} by sandbox${users.length > 1 ? "es" : ""} ${users.join(", ")}`);
  }
  const pids: number[] = [];
  if (problems.length === 0) {
    for (const [tag, found] of await qemusUsing(paths, tags)) {
      pids.push(...found);
      problems.push(`${tag} by QEMU process${found.length > 1 ? "es" : ""} ${found.join(", ")}`);
    }
  }
  if (problems.length > 0) {
    throw conflict(`in use by running VMs (kill them first): ${problems.join("; ")}`, {
      sandboxes: [...sandboxes],
      pids,
    });
  }
}

// ---- rmi ----

/**
 * Deletes `tag`. A snapshot others depend on is refused (409 naming them) unless `cascade` (they go too, leaves
 * first) or `force` (they stay, orphaned: restoring them then fails with a 409 naming the missing layer). Never
 * while a running VM maps the snapshot or anything depending on it. Returns the tags deleted, in order.
 */
export async function removeSnapshot(
  paths: ForkdPaths,
  tag: string,
  options: RemoveOptions = {},
): Promise<string[]> {
  assertTag(tag);
  if (options.cascade && options.force) throw invalidArgument("--cascade and --force exclude each other");
  const store = new SnapshotStore(paths.snapshots);
  if (!(await store.exists(tag))) {
    throw new ForkdError("not_found", `snapshot ${JSON.stringify(tag)} not found`);
  }
  const graph = await loadGraph(store);
  const dependents = graph.children.get(tag) ?? [];
  const all = descendantsOf(graph, tag);
  if (all.length > 0 && !options.cascade && !options.force) {
    throw conflict(
      `snapshot ${JSON.stringify(tag)} has dependents: ${all.join(", ")} (delete them first, ` +
        "or use --cascade to delete them too, or --force to leave them orphaned and unbootable)",
      { dependents, all_dependents: all },
    );
  }
  // A child of any descendant maps this snapshot's disk layer (and, through the assembled image, its memory).
  await assertUnused(paths, [tag, ...all], options);
  const doomed = options.cascade ? [...all].reverse().concat(tag) : [tag];
  // Orphans can never be restored again, so their assembled images go too.
  const cachedImagesOf = options.cascade ? doomed : [tag, ...all];
  for (const t of cachedImagesOf) {
    if (graph.byTag.has(t)) await removeAssembledImages(paths, t, store.dirOf(t));
  }
  const deleted: string[] = [];
  for (const t of doomed) {
    await store.delete(t);
    deleted.push(t);
  }
  return deleted;
}

/**
 * Removes the cached flat RAM images assembled for snapshot `tag` whose files are in `dir` (on disk and on
 * tmpfs; they are named after the manifest's digest, see store/memory-images.ts).
 */
export async function removeAssembledImages(paths: ForkdPaths, tag: string, dir: string): Promise<void> {
  const bytes = await readFile(path.join(dir, MANIFEST_FILE)).catch(() => null);
  if (bytes === null) return;
  const digest = createHash("sha256").update(bytes).digest("hex");
  const dirs = cacheDirs(paths);
  for (const cache of [dirs.cacheDir, dirs.tmpfsDir]) await removeAssembledImage(cache, tag, digest);
}

// ---- compact ----

export interface CompactOptions {
  from: string;
  to: string;
  signal?: AbortSignal;
  onProgress?: (message: string) => void;
}

/**
 * Folds the chain ending at `from` into a new snapshot `to` with no parent: memory = the chain's assembled RAM
 * image (memory.bin, sparse), disk = one qcow2 layer backed directly by the image's root filesystem holding
 * every block the chain changed, device state = the head's. Staged and renamed like every snapshot. The chain's
 * files are verified first: compaction re-hashes what it writes, so it must not launder a corrupted layer.
 */
export async function compactSnapshot(paths: ForkdPaths, options: CompactOptions): Promise<StoredSnapshot> {
  const from = assertTag(options.from, "source tag");
  const to = assertTag(options.to, "target tag");
  if (from === to) throw invalidArgument("compact into a new tag: the source's dependents need it unchanged");
  const progress = options.onProgress ?? (() => {});
  const signal = options.signal;
  const store = new SnapshotStore(paths.snapshots);
  const chain = await resolveChain(store, from);
  const head = chain[chain.length - 1] as StoredSnapshot;
  const problem = await snapshotIsBootable(head);
  if (problem) throw conflict(`snapshot ${from} is not bootable: ${problem}`);
  progress(`verifying ${chain.length} layer${chain.length > 1 ? "s" : ""}`);
  await verifyChainFiles(paths, chain);

  // The flat RAM image, and at most every cluster the chain's disk layers hold.
  const layerDiskBytes = chain.reduce(
    (sum, s) => sum + (s.manifest.files[SNAPSHOT_FILES.disk]?.size ?? 0),
    0,
  );
  const writer = await store.beginWrite(to, {
    expectedBytes: head.manifest.memory.ramBytes + layerDiskBytes,
  });
  crashPoint("compact.staged");
  try {
    progress("writing the flat RAM image");
    const image = await flatImageFor(chain, memoryImageOptions(paths));
    await execFileAsync(
      "cp",
      ["--sparse=always", "--reflink=auto", "--", image, writer.file(SNAPSHOT_FILES.memory)],
      {
        signal,
      },
    );
    await copyFile(path.join(head.dir, SNAPSHOT_FILES.deviceState), writer.file(SNAPSHOT_FILES.deviceState));

    progress("folding the disk layers into one");
    await writeFlatDisk({
      topLayer: path.join(head.dir, SNAPSHOT_FILES.disk),
      rootfs: head.manifest.image.rootfs,
      snapshotDir: writer,
      signal,
    });

    crashPoint("compact.written");
    progress("hashing and committing");
    const ramBytes = head.manifest.memory.ramBytes;
    const { format: _f, tag: _t, files: _files, createdAtUnix: _c, ...rest } = head.manifest;
    await writer.commit(
      {
        ...rest,
        parent: null,
        memory: { format: "flat", ramBytes, pages: ramBytes / PAGE_SIZE },
        origin: {
          kind: "compact",
          mode: null,
          sourceSandbox: null,
          pauseMs: null,
          compactedFrom: { tag: head.tag, manifestSha256: await manifestDigest(head) },
        },
      },
      [SNAPSHOT_FILES.memory, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
      signal,
    );
  } finally {
    await writer.abort();
  }
  const compacted = await store.get(to);
  // Just hashed by commit: record it so the first child does not hash 512 MiB again.
  const verifier = new FileVerifier(cacheDirs(paths).verifiedDir);
  for (const [name, { sha256 }] of Object.entries(compacted.manifest.files)) {
    await verifier.remember(path.join(compacted.dir, name), sha256);
  }
  return compacted;
}
