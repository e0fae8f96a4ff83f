/**
 * BRANCH: snapshot a running sandbox mid-work and keep it running. The source is paused only while its device
 * state, its private RAM pages (those it wrote since its restore) and its disk layer are taken; the files are
 * written after it resumes. Children of the new snapshot continue the source's in-flight work.
 *
 *   diff  memory.layer = the captured pages (relative to the parent's RAM image)
 *   full  memory.bin   = a flat image: the parent's image with the captured pages applied
 *   live  (see branch-live.ts) RAM captured by QEMU's background snapshot while the guest runs
 *
 * The parent of a branch is the source's previous branch if it has one, else the snapshot it was restored
 * from: the source's disk continues on a fresh overlay on top of each frozen layer, so its disk chain runs
 * through every branch taken of it.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { link, open } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { conflict, errorMessage, ForkdError, invalidArgument } from "../common/errors.js";
import { assertTag } from "../common/names.js";
import type { ForkdPaths } from "../common/paths.js";
import { MAX_CHAIN_DEPTH, manifestDigest, resolveChain } from "../store/chain.js";
import type { StateDb } from "../store/db.js";
import type { SnapshotManifest } from "../store/manifest.js";
import { PAGE_SIZE, writeMemoryLayer, writePagesAt } from "../store/memory-layer.js";
import type { SnapshotStore, StoredSnapshot } from "../store/snapshot-store.js";
import { findGuestRamMapping, readPages, scanPrivatePages } from "../vmm/guest-memory.js";
import { createOverlay } from "../vmm/qemu-tools.js";
import { saveDeviceState } from "../vmm/snapshot.js";
import { SNAPSHOT_FILES } from "./machine.js";
import type { SandboxHandle } from "./sandbox.js";

const execFileAsync = promisify(execFile);

export type BranchMode = "full" | "diff" | "live";

/** BRANCHes running at once, host-wide: each copies RAM and writes files; more only thrash the disk. */
export const MAX_CONCURRENT_BRANCHES = 2;

export interface BranchRequest {
  tag?: string;
  mode?: BranchMode;
  /** live only: false answers as soon as the source runs again, with status "writing". */
  wait?: boolean;
  /** The parent the caller expects (v0.5 clients send it); conflict when the source's base differs. */
  parentTag?: string;
  signal?: AbortSignal;
}

export interface BranchResult {
  tag: string;
  mode: BranchMode;
  parent_tag: string;
  status: "writing" | "ready";
  /** How long the source was paused. */
  pause_ms: number;
  /** Guest RAM captured (pages the source changed), bytes. */
  bytes_captured: number;
  /** Bytes written to disk for the new snapshot (memory + device state + disk layer). */
  bytes_written: number;
}

/** What the brancher needs to know about a live source. */
export interface BranchSource {
  handle: SandboxHandle;
  /** Tag of the source's latest branch, or null (then its parent is the snapshot it came from). */
  lastBranchTag: string | null;
  /** The source's current writable disk layer (QEMU node and file). */
  disk: DiskLayer;
}

export interface DiskLayer {
  node: string;
  file: string;
}

export interface BranchEvents {
  /** The source now writes to `disk` (recorded even if the branch then fails: the switch already happened). */
  diskSwitched(sandboxId: string, disk: DiskLayer): void;
  /** The branch is committed; the source's next branch chains onto it. */
  branched(sandboxId: string, tag: string): void;
  /**
   * The branch failed after the source's disk was switched: its chain now holds a frozen layer no snapshot
   * owns (it lives in the run directory), so a later branch would depend on a file that dies with the source.
   */
  blocked(sandboxId: string, reason: string): void;
}

export function defaultBranchTag(sandboxId: string): string {
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "-");
  return `branch-${sandboxId}-${stamp}-${randomBytes(2).toString("hex")}`;
}

export class Brancher {
  private readonly perSource = new Map<string, Promise<unknown>>();
  private running = 0;

  constructor(
    private readonly paths: ForkdPaths,
    private readonly store: SnapshotStore,
    private readonly db: StateDb,
    private readonly events: BranchEvents,
  ) {}

  async branch(source: BranchSource, request: BranchRequest): Promise<BranchResult> {
    const mode = request.mode ?? "diff";
    if (mode !== "full" && mode !== "diff" && mode !== "live") {
      throw invalidArgument(`mode must be full, diff or live, got ${JSON.stringify(mode)}`);
    }
    if (mode === "live") {
      throw new ForkdError("not_implemented", "live BRANCH is not available yet; use mode diff or full");
    }
    if (request.wait === false) {
      throw invalidArgument("wait: false is only possible with mode live");
    }
    const tag = assertTag(request.tag ?? defaultBranchTag(source.handle.id));
    if (this.running >= MAX_CONCURRENT_BRANCHES) {
      throw new ForkdError(
        "unavailable",
        `${this.running} BRANCHes are running (limit ${MAX_CONCURRENT_BRANCHES}); retry shortly`,
      );
    }
    // Branches of one source are serialised: each freezes the disk layer the next one builds on.
    const previous = this.perSource.get(source.handle.id) ?? Promise.resolve();
    const mine = previous
      .catch(() => {})
      .then(() => this.branchNow(source, tag, mode, request.parentTag, request.signal));
    this.perSource.set(source.handle.id, mine);
    this.running++;
    try {
      return await mine;
    } finally {
      this.running--;
      if (this.perSource.get(source.handle.id) === mine) this.perSource.delete(source.handle.id);
    }
  }

  private async branchNow(
    source: BranchSource,
    tag: string,
    mode: "full" | "diff",
    expectedParent: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<BranchResult> {
    const { handle } = source;
    const parentTag = source.lastBranchTag ?? handle.snapshotTag;
    if (expectedParent !== undefined && expectedParent !== parentTag) {
      throw conflict(`parent_tag ${expectedParent} does not match the sandbox's base ${parentTag}`);
    }
    const chain = await resolveChain(this.store, parentTag);
    if (chain.length > MAX_CHAIN_DEPTH) {
      throw conflict(
        `snapshot ${parentTag} is already ${chain.length - 1} layers deep; compact it before branching`,
      );
    }
    const parent = chain[chain.length - 1] as StoredSnapshot;
    if (!this.db.claimSnapshotJob(job(tag, "writing", mode, null))) {
      throw conflict(`snapshot ${JSON.stringify(tag)} is already being written`);
    }
    let writer: Awaited<ReturnType<SnapshotStore["beginWrite"]>> | undefined;
    let switched = false;
    try {
      writer = await this.store.beginWrite(tag);
      const ramBytes = parent.manifest.memory.ramBytes;
      const qmp = await handle.qmp();
      const mapping = findGuestRamMapping(handle.pid, handle.memoryImage, { expectedBytes: ramBytes });
      const top = source.disk;
      // Made before the pause so the pause only has to attach it: the source's next writable layer.
      const nextOverlay = path.join(
        handle.runDir,
        `disk-${Date.now()}-${randomBytes(3).toString("hex")}.qcow2`,
      );
      await createOverlay({ backing: top.file, backingFormat: "qcow2", overlay: nextOverlay });
      const nextNode = `disk-${randomBytes(4).toString("hex")}`;

      // ---- the source is paused from here ----
      const pausedAt = performance.now();
      let pages: Uint32Array;
      let data: Buffer;
      try {
        await saveDeviceState(qmp, writer.file(SNAPSHOT_FILES.deviceState), { signal });
        pages = scanPrivatePages(mapping).pages;
        data = Buffer.allocUnsafe(pages.length * PAGE_SIZE);
        readPages(mapping, pages, data);
        await qmp.execute("blockdev-add", {
          driver: "qcow2",
          "node-name": nextNode,
          file: { driver: "file", filename: nextOverlay },
          backing: null,
        });
        await qmp.execute("blockdev-snapshot", { node: top.node, overlay: nextNode });
        this.events.diskSwitched(handle.id, { node: nextNode, file: nextOverlay });
        switched = true;
      } finally {
        await qmp.execute("cont").catch(() => {});
      }
      const pauseMs = performance.now() - pausedAt;
      // ---- running again ----

      await link(top.file, writer.file(SNAPSHOT_FILES.disk));
      const memoryFile = mode === "diff" ? SNAPSHOT_FILES.memoryLayer : SNAPSHOT_FILES.memory;
      if (mode === "diff") {
        await writeMemoryLayer(writer.file(memoryFile), ramBytes, pages, data);
      } else {
        await execFileAsync("cp", [
          "--sparse=always",
          "--reflink=auto",
          "--",
          handle.memoryImage,
          writer.file(memoryFile),
        ]);
        await writePagesToImage(writer.file(memoryFile), pages, data);
      }
      // The source's new layer names the frozen one by where it will live for good, relative like all layers;
      // if the snapshot is not committed after all, it goes back to naming the file in the run directory.
      const setBacking = (backing: string) =>
        qmp.execute("change-backing-file", {
          device: nextNode,
          "image-node-name": nextNode,
          "backing-file": backing,
        });
      await setBacking(path.join("..", "..", "snapshots", tag, SNAPSHOT_FILES.disk));
      const manifest = await writer
        .commit(
          branchManifest(parent.manifest, {
            parent: { tag: parent.tag, manifestSha256: await manifestDigest(parent) },
            memory: { format: mode === "diff" ? "layer" : "flat", ramBytes, pages: pages.length },
            origin: {
              kind: "branch",
              mode,
              sourceSandbox: handle.id,
              pauseMs: Math.round(pauseMs * 10) / 10,
            },
          }),
          [memoryFile, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
          signal,
        )
        .catch(async (err) => {
          await setBacking(top.file).catch(() => {});
          throw err;
        });
      this.events.branched(handle.id, tag);
      this.db.deleteSnapshotJob(tag);
      return {
        tag,
        mode,
        parent_tag: parent.tag,
        status: "ready",
        pause_ms: Math.round(pauseMs * 10) / 10,
        bytes_captured: pages.length * PAGE_SIZE,
        bytes_written: Object.values(manifest.files).reduce((sum, f) => sum + f.size, 0),
      };
    } catch (err) {
      if (switched)
        this.events.blocked(handle.id, `a BRANCH failed after its disk was switched: ${errorMessage(err)}`);
      await writer?.abort();
      this.db.upsertSnapshotJob(job(tag, "failed", mode, errorMessage(err).split("\n")[0] ?? "failed"));
      throw err;
    }
  }
}

function job(tag: string, status: "writing" | "failed", mode: string, error: string | null) {
  return {
    tag,
    status,
    kind: `branch-${mode}`,
    started_at_unix: Math.floor(Date.now() / 1000),
    writer_pid: process.pid,
    error,
  };
}

function branchManifest(
  parent: SnapshotManifest,
  fields: Pick<SnapshotManifest, "parent" | "memory" | "origin">,
): Omit<SnapshotManifest, "format" | "tag" | "files" | "createdAtUnix"> {
  return {
    template: parent.template,
    image: parent.image,
    machine: parent.machine,
    timings: { bootMs: 0, warmupMs: 0, saveMs: fields.origin.pauseMs ?? 0 },
    ...fields,
  };
}

async function writePagesToImage(image: string, pages: Uint32Array, data: Buffer): Promise<void> {
  const handle = await open(image, "r+");
  try {
    await writePagesAt(handle, pages, data);
    await handle.sync();
  } finally {
    await handle.close();
  }
}
