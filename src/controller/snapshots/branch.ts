/**
 * BRANCH: snapshot a running sandbox mid-work and keep it running. The source is paused only while its device
 * state, its private RAM pages (those it wrote since its restore) and its disk layer are taken; the files are
 * written after it resumes. Children of the new snapshot continue the source's in-flight work.
 *
 *   full  (the default, as in forkd v0.5) a snapshot that stands alone: memory.bin is the source's RAM image
 *         with the captured pages applied, disk.qcow2 holds the whole disk chain in one layer over the image's
 *         root filesystem (flat-disk.ts). No parent: its base can be deleted once no sandbox uses it.
 *   diff  memory.layer = the captured pages (relative to the parent's RAM image); disk = the frozen layer
 *   live  like diff, RAM captured by QEMU's background snapshot while the guest runs (vmm/live-capture.ts)
 *
 * The parent of a diff/live branch is the source's previous branch if it has one, else the snapshot it was
 * restored from: the source's disk continues on a fresh overlay on top of each frozen layer, so its disk chain
 * runs through every branch taken of it. After a full branch that chain runs through the full snapshot's own
 * disk (the same content as the frozen layer and everything under it), so later branches build on it.
 */

import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { lchown, link, open, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { assertTag, isValidTag } from "../../common/names.js";
import { MAX_CHAIN_DEPTH, manifestDigest, resolveChain } from "../../store/chain.js";
import type { StateDb } from "../../store/db.js";
import type { SnapshotManifest } from "../../store/manifest.js";
import { PAGE_SIZE, writeMemoryLayer, writePagesAt } from "../../store/memory-layer.js";
import type { SnapshotStore, SnapshotWriter, StoredSnapshot } from "../../store/snapshot-store.js";
import {
  type FrozenDisk,
  freezeDisk,
  type PreparedDiskFreeze,
  prepareDiskFreeze,
} from "../../vmm/disk-layers.js";
import { findGuestRamMapping, scanPrivatePages } from "../../vmm/guest-memory.js";
import { captureLive, MemoryPageSink } from "../../vmm/live-capture.js";
import type { QmpClient } from "../../vmm/qmp.js";
import { captureStopped } from "../../vmm/stopped-capture.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";
import { changedAgainstChain } from "./chain-ram.js";
import { writeFlatDisk } from "./flat-disk.js";

const execFileAsync = promisify(execFile);

export type BranchMode = "full" | "diff" | "live";

/** The mode of a BRANCH that names none: forkd v0.5's. */
export const DEFAULT_BRANCH_MODE: BranchMode = "full";

/**
 * BRANCHes running at once, host-wide, unless the daemon sets another cap (`--branch-concurrency`): each copies
 * RAM and writes files; more only thrash the disk.
 */
export const MAX_CONCURRENT_BRANCHES = 2;
/** The largest `--branch-concurrency` accepted. */
export const MAX_BRANCH_CONCURRENCY = 256;

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
  /** null for a full branch (it stands alone). */
  parent_tag: string | null;
  status: "writing" | "ready";
  /** How long the source was paused. */
  pause_ms: number;
  /**
   * Time spent finding and copying the pages the source changed: inside the pause for full and diff, the
   * background capture for live (forkd v0.5's `diff_ms`). 0 for a `wait: false` answer (not finished yet).
   */
  capture_ms: number;
  /** Guest RAM captured (pages the source changed), bytes. */
  bytes_captured: number;
  /** The guest's RAM size, bytes. */
  ram_bytes: number;
  /** Bytes written to disk for the new snapshot (memory + device state + disk layer). */
  bytes_written: number;
}

/** What the brancher needs to know about a live source. */
export interface BranchSource {
  handle: SandboxHandle;
  /** Tag of the source's latest branch, or null (then its parent is the snapshot it came from). */
  lastBranchTag: string | null;
  /** The source maps its RAM from tmpfs (spawned with live_fork): live mode is possible. */
  liveFork: boolean;
  /** The source's tenant, who owns every snapshot branched from it (null: an admin). */
  owner: string | null;
  /** Runs before a live capture (what the host must allow for QEMU's userfaultfd; see isolation/userfaultfd.ts). */
  beforeLive?: () => Promise<void>;
}

export interface BranchEvents {
  /** The branch is committed (and any BRANCH_INTERRUPTED mark cleared); the next branch chains onto it. */
  branched(sandboxId: string, tag: string): void;
  /**
   * The source may not be branched (again): a branch failed after the source's disk was switched (its chain now
   * holds a frozen layer no snapshot owns, in the run directory, so a later branch would depend on a file that
   * dies with the source), or one is about to switch it (BRANCH_INTERRUPTED, cleared by branched/unblocked).
   * Persisted, so a daemon restart knows it.
   */
  blocked(sandboxId: string, reason: string): void;
  /** A branch failed before its disk switch: the BRANCH_INTERRUPTED mark goes. */
  unblocked(sandboxId: string): void;
}

export function defaultBranchTag(sandboxId: string): string {
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "-");
  return `branch-${sandboxId}-${stamp}-${randomBytes(2).toString("hex")}`;
}

/**
 * The mark a BRANCH leaves on its source while its disk switch is not backed by a committed snapshot yet (see
 * sandboxes/reattach.ts, settleInterruptedBranch): the branch_blocked reason, followed by the new snapshot's tag.
 */
export const BRANCH_INTERRUPTED = "a BRANCH was interrupted (the daemon stopped) after switching the disk to";

/** The tag an interrupted BRANCH was writing, from a branch_blocked reason; null for any other reason. */
export function interruptedBranchTag(reason: string | null): string | null {
  if (reason === null || !reason.startsWith(`${BRANCH_INTERRUPTED} `)) return null;
  const tag = reason.slice(BRANCH_INTERRUPTED.length + 1);
  return isValidTag(tag) ? tag : null;
}

export class Brancher {
  private readonly perSource = new Map<string, Promise<unknown>>();
  /** Live branches answered early (`wait: false`) whose snapshot is still being written, by source. */
  private readonly writing = new Map<string, Promise<void>>();
  private running = 0;

  constructor(
    private readonly store: SnapshotStore,
    private readonly db: StateDb,
    private readonly events: BranchEvents,
    /** Host-wide cap on BRANCHes in flight; more are answered `unavailable` (503). */
    readonly concurrencyCap = MAX_CONCURRENT_BRANCHES,
  ) {
    if (!Number.isInteger(concurrencyCap) || concurrencyCap < 1 || concurrencyCap > MAX_BRANCH_CONCURRENCY) {
      throw invalidArgument(`the BRANCH concurrency cap must be an integer in 1..${MAX_BRANCH_CONCURRENCY}`);
    }
  }

  /** Resolves once no branch of `sourceId` is still writing its snapshot (a pause must build on it). */
  async settled(sourceId: string): Promise<void> {
    await this.perSource.get(sourceId)?.catch(() => {});
    await this.writing.get(sourceId);
  }

  /** BRANCHes admitted and not finished (waiting for an earlier branch of the same source included). */
  get inFlight(): number {
    return this.running;
  }

  /** Whether a BRANCH of `sandboxId` is running or queued in this process. */
  isBranching(sandboxId: string): boolean {
    return this.perSource.has(sandboxId);
  }

  async branch(source: BranchSource, request: BranchRequest): Promise<BranchResult> {
    const mode = request.mode ?? DEFAULT_BRANCH_MODE;
    if (mode !== "full" && mode !== "diff" && mode !== "live") {
      throw invalidArgument(`mode must be full, diff or live, got ${JSON.stringify(mode)}`);
    }
    if (request.wait === false && mode !== "live") {
      throw invalidArgument("wait: false is only possible with mode live");
    }
    const tag = assertTag(request.tag ?? defaultBranchTag(source.handle.id));
    if (this.running >= this.concurrencyCap) {
      throw new ForkdError(
        "unavailable",
        `${this.running} BRANCHes are running (limit ${this.concurrencyCap}, --branch-concurrency); retry shortly`,
      );
    }
    // Branches of one source are serialised: each freezes the disk layer the next one builds on.
    const previous = this.perSource.get(source.handle.id) ?? Promise.resolve();
    const mine = previous.catch(() => {}).then(() => this.branchNow(source, tag, mode, request));
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
    mode: BranchMode,
    request: BranchRequest,
  ): Promise<BranchResult> {
    const chain = await this.checkedChain(source, mode, request);
    if (!this.db.claimSnapshotJob({ ...job(tag, "writing", mode, null), owner: source.owner })) {
      throw conflict(`snapshot ${JSON.stringify(tag)} is already being written`);
    }
    crashPoint("branch.claimed");
    const run = new BranchRun(
      { store: this.store, db: this.db, events: this.events },
      source,
      tag,
      mode,
      request,
      chain,
    );
    try {
      const capture = await run.start();
      if (request.wait === false) return await this.answerEarly(run, capture);
      return await run.finish(capture);
    } catch (err) {
      await run.fail(err);
      throw err;
    }
  }

  /** The chain the branch goes on (the source's base last), once the request fits the source. */
  private async checkedChain(
    source: BranchSource,
    mode: BranchMode,
    request: BranchRequest,
  ): Promise<StoredSnapshot[]> {
    const { handle } = source;
    const parentTag = source.lastBranchTag ?? handle.snapshotTag;
    if (request.parentTag !== undefined && request.parentTag !== parentTag) {
      throw conflict(`parent_tag ${request.parentTag} does not match the sandbox's base ${parentTag}`);
    }
    if (mode === "live" && !source.liveFork) {
      throw conflict(
        `live BRANCH needs a sandbox spawned with live_fork (its RAM on tmpfs, which userfaultfd can write-protect); ${handle.id} was not`,
      );
    }
    const chain = await resolveChain(this.store, parentTag);
    if (mode !== "full" && chain.length > MAX_CHAIN_DEPTH) {
      throw conflict(
        `snapshot ${parentTag} is already ${chain.length - 1} layers deep; compact it before branching`,
      );
    }
    return chain;
  }

  /**
   * `wait: false`: answers once the source runs again; the rest happens in the background, and the job row says
   * "writing" until it is "ready" (row deleted) or "failed". A daemon restart in between marks it failed and
   * sweeps the staging directory.
   */
  private async answerEarly(run: BranchRun, capture: Capture): Promise<BranchResult> {
    const pauseMs = await capture.resumed;
    const sourceId = run.source.handle.id;
    const background = run.finish(capture).then(
      () => {},
      (err) => run.fail(err),
    );
    this.writing.set(sourceId, background);
    background.finally(() => {
      if (this.writing.get(sourceId) === background) this.writing.delete(sourceId);
    });
    return {
      tag: run.tag,
      mode: run.mode,
      parent_tag: run.flat ? null : run.parent.tag,
      status: "writing",
      pause_ms: round1(pauseMs),
      capture_ms: 0,
      bytes_captured: 0,
      ram_bytes: run.ramBytes,
      bytes_written: 0,
    };
  }
}

/**
 * One BRANCH under way, from its claimed job to its committed snapshot: what it has made so far (the staging
 * writer, the prepared or frozen disk), so that a failure undoes exactly that.
 */
class BranchRun {
  readonly parent: StoredSnapshot;
  readonly flat: boolean;
  readonly ramBytes: number;
  private writer: SnapshotWriter | undefined;
  private frozen: FrozenDisk | undefined;
  private prepared: PreparedDiskFreeze | undefined;

  constructor(
    private readonly brancher: { store: SnapshotStore; db: StateDb; events: BranchEvents },
    readonly source: BranchSource,
    readonly tag: string,
    readonly mode: BranchMode,
    private readonly request: BranchRequest,
    private readonly chain: StoredSnapshot[],
  ) {
    this.parent = chain[chain.length - 1] as StoredSnapshot;
    this.flat = mode === "full";
    this.ramBytes = this.parent.manifest.memory.ramBytes;
  }

  /** Prepares the source's next disk layer, marks the source, and starts the capture (the pause). */
  async start(): Promise<Capture> {
    const { handle } = this.source;
    const { signal } = this.request;
    const { tag, mode } = this;
    // Up to the whole RAM (a full branch writes a flat image; a diff branch the pages written since restore).
    const writer = await this.brancher.store.beginWrite(tag, { expectedBytes: this.ramBytes });
    this.writer = writer;
    const qmp = await handle.qmp();
    // The source's next writable layer, made before the pause. Its header already names the frozen layer's
    // permanent place in the new snapshot (relative, like every layer).
    if (mode === "live") await this.source.beforeLive?.();
    const prepared = await prepareDiskFreeze(qmp, {
      overlayFile: path.join(handle.runDir, `disk-${Date.now()}-${randomBytes(3).toString("hex")}.qcow2`),
      backingPath: path.join("..", "..", "snapshots", tag, SNAPSHOT_FILES.disk),
      // An unprivileged QEMU opens its next writable layer read-write: it must be its own.
      owner: handle.vmOwner ?? undefined,
      signal,
    });
    this.prepared = prepared;
    crashPoint("branch.prepared");
    // Written ahead of the disk switch: a daemon that dies between the switch and the commit leaves the mark,
    // and the restart then knows the source's chain runs through a layer no snapshot may own.
    this.brancher.events.blocked(handle.id, `${BRANCH_INTERRUPTED} ${tag}`);
    crashPoint("branch.marked");
    const whileStopped = async () => {
      this.frozen = await freezeDisk(qmp, prepared, { signal });
      this.prepared = undefined;
      // QEMU has reopened the frozen layer read-only; from now on the file is a snapshot layer, root's.
      if (handle.vmOwner) await lchown(this.frozen.frozenFile, 0, 0);
      crashPoint("branch.stopped");
    };
    const deviceStatePath = writer.file(SNAPSHOT_FILES.deviceState);
    return mode === "live"
      ? captureLivePages(handle, qmp, this.ramBytes, deviceStatePath, whileStopped, signal)
      : captureStoppedPages(handle, qmp, this.ramBytes, deviceStatePath, whileStopped, signal);
  }

  /** Once the capture is done: the snapshot's files written and committed, the source's record told. */
  async finish(capture: Capture): Promise<BranchResult> {
    const { handle } = this.source;
    const { tag, mode, flat, parent, ramBytes } = this;
    const raw = await capture.done;
    crashPoint("branch.captured");
    // A diff layer stores what changed relative to its parent, not everything the source changed since its
    // restore: after earlier branches of the same source most of those pages are already in their layers.
    const captured =
      mode === "full"
        ? raw
        : {
            ...raw,
            ...(await changedAgainstChain(this.chain, handle.snapshotTag, handle.memoryImage, raw)),
          };
    await this.writeDisk();
    const memoryFile = await this.writeMemory(captured);
    captured.release();
    crashPoint("branch.written");
    const manifest = await (this.writer as SnapshotWriter).commit(
      branchManifest(parent.manifest, {
        parent: flat ? null : { tag: parent.tag, manifestSha256: await manifestDigest(parent) },
        memory: { format: flat ? "flat" : "layer", ramBytes, pages: captured.pages.length },
        origin: { kind: "branch", mode, sourceSandbox: handle.id, pauseMs: round1(captured.pauseMs) },
      }),
      [memoryFile, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
      this.request.signal,
    );
    crashPoint("branch.committed");
    this.brancher.events.branched(handle.id, tag);
    this.brancher.db.deleteSnapshotJob(tag);
    return {
      tag,
      mode,
      parent_tag: flat ? null : parent.tag,
      status: "ready",
      pause_ms: round1(captured.pauseMs),
      capture_ms: round1(raw.captureMs),
      bytes_captured: raw.pages.length * PAGE_SIZE,
      ram_bytes: ramBytes,
      bytes_written: await physicalBytes(
        Object.keys(manifest.files).map((name) => path.join(this.brancher.store.dirOf(tag), name)),
      ),
    };
  }

  /** The snapshot's disk: the frozen layer itself (diff, live), or the whole chain in one layer (full). */
  private async writeDisk(): Promise<void> {
    const frozenDisk = this.frozen as FrozenDisk;
    const writer = this.writer as SnapshotWriter;
    if (this.flat) {
      // The source's next overlay names this file as its backing: the same content as the frozen layer.
      await writeFlatDisk({
        topLayer: frozenDisk.frozenFile,
        rootfs: this.parent.manifest.image.rootfs,
        snapshotDir: writer,
        signal: this.request.signal,
      });
    } else {
      await link(frozenDisk.frozenFile, writer.file(SNAPSHOT_FILES.disk));
    }
  }

  /** The snapshot's memory: the source's RAM image with the pages applied (full), or a layer of them. */
  private async writeMemory(captured: { pages: Uint32Array; data: Buffer }): Promise<string> {
    const writer = this.writer as SnapshotWriter;
    const memoryFile = this.flat ? SNAPSHOT_FILES.memory : SNAPSHOT_FILES.memoryLayer;
    if (this.flat) {
      await execFileAsync("cp", [
        "--sparse=always",
        "--reflink=auto",
        "--",
        this.source.handle.memoryImage,
        writer.file(memoryFile),
      ]);
      await writePagesToImage(writer.file(memoryFile), captured.pages, captured.data);
    } else {
      await writeMemoryLayer(writer.file(memoryFile), this.ramBytes, captured.pages, captured.data);
    }
    return memoryFile;
  }

  /** Undoes what the branch made; the source stays blocked when its disk was already switched. */
  async fail(err: unknown): Promise<void> {
    const { events, db } = this.brancher;
    const sourceId = this.source.handle.id;
    if (this.frozen)
      events.blocked(sourceId, `a BRANCH failed after its disk was switched: ${errorMessage(err)}`);
    else events.unblocked(sourceId);
    await this.prepared?.abandon().catch(() => {});
    await this.writer?.abort();
    db.upsertSnapshotJob(job(this.tag, "failed", this.mode, errorMessage(err).split("\n")[0] ?? "failed"));
  }
}

/** Stop-and-copy: the pause includes copying the private pages (into a buffer touched before the pause). */
function captureStoppedPages(
  handle: SandboxHandle,
  qmp: QmpClient,
  ramBytes: number,
  deviceStatePath: string,
  whileStopped: () => Promise<void>,
  signal: AbortSignal | undefined,
): Capture {
  const done = (async () => {
    const mapping = findGuestRamMapping(handle.pid, handle.memoryImage, { expectedBytes: ramBytes });
    // A moment's view of the private set sizes the destination; touching it now keeps page faults out of the
    // pause (pages only become private, so the set in the pause may be a little larger).
    const estimate = scanPrivatePages(mapping).pages.length;
    const buffer = Buffer.alloc((estimate + CAPTURE_HEADROOM_PAGES) * PAGE_SIZE);
    const captured = await captureStopped({
      qmp,
      pid: handle.pid,
      memoryFile: handle.memoryImage,
      memoryBytes: ramBytes,
      deviceStatePath,
      deviceStateDrop: handle.vmOwner ? { dir: handle.runDir, owner: handle.vmOwner } : undefined,
      whileStopped,
      buffer,
      signal,
    });
    return {
      pages: captured.pages,
      data: captured.data,
      pauseMs: captured.pauseMs,
      captureMs: captured.scanMs + captured.copyMs,
      release: () => {},
    };
  })();
  return { done, resumed: done.then((c) => c.pauseMs) };
}

/** QEMU's background snapshot: the pause is the device state and the disk freeze; RAM streams afterwards. */
function captureLivePages(
  handle: SandboxHandle,
  qmp: QmpClient,
  ramBytes: number,
  deviceStatePath: string,
  whileStopped: () => Promise<void>,
  signal: AbortSignal | undefined,
): Capture {
  const sink = new MemoryPageSink();
  let resolveResumed: (pauseMs: number) => void = () => {};
  const resumed = new Promise<number>((resolve) => {
    resolveResumed = resolve;
  });
  const started = performance.now();
  const done = (async () => {
    const onResume = qmp
      .waitEvent("RESUME", { signal })
      .then(() => resolveResumed(performance.now() - started));
    onResume.catch(() => {});
    const result = await captureLive({
      qmp,
      pid: handle.pid,
      memoryFile: handle.memoryImage,
      memoryBytes: ramBytes,
      socketDir: handle.runDir,
      socketOwner: handle.vmOwner ?? undefined,
      deviceStatePath,
      sink,
      pages: "private",
      whileStopped,
      signal,
    });
    resolveResumed(result.pauseWallMs);
    const { pages, data } = sortPages(sink.take());
    return { pages, data, pauseMs: result.pauseWallMs, captureMs: result.totalMs, release: () => {} };
  })();
  done.catch(() => resolveResumed(Number.NaN));
  return { done, resumed: Promise.race([resumed, done.then((c) => c.pauseMs)]) };
}

/** Pages captured in one pause, sorted by index, and when the source ran again. */
interface Capture {
  done: Promise<{ pages: Uint32Array; data: Buffer; pauseMs: number; captureMs: number; release(): void }>;
  resumed: Promise<number>;
}

/** Extra pages the stop-and-copy buffer holds beyond the pre-pause estimate (16 MiB). */
const CAPTURE_HEADROOM_PAGES = 4096;

function sortPages(taken: { pages: Uint32Array; data: Buffer }): { pages: Uint32Array; data: Buffer } {
  const order = Array.from(taken.pages.keys()).sort(
    (a, b) => (taken.pages[a] as number) - (taken.pages[b] as number),
  );
  const pages = new Uint32Array(order.length);
  const data = Buffer.allocUnsafe(order.length * PAGE_SIZE);
  order.forEach((from, to) => {
    pages[to] = taken.pages[from] as number;
    taken.data.copy(data, to * PAGE_SIZE, from * PAGE_SIZE, (from + 1) * PAGE_SIZE);
  });
  return { pages, data };
}

async function physicalBytes(files: string[]): Promise<number> {
  let total = 0;
  for (const file of files) total += (await stat(file)).blocks * 512;
  return total;
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}

function job(tag: string, status: "writing" | "failed", mode: string, error: string | null) {
  return {
    tag,
    status,
    kind: `branch-${mode}`,
    started_at_unix: Math.floor(Date.now() / 1000),
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
