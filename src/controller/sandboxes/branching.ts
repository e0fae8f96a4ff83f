/**
 * BRANCH of a sandbox as the service runs it: under the sandbox's lock, a running one through the Brancher
 * (../snapshots/branch.ts) with admission for its page copy and, for a live capture of a confined QEMU, the
 * host's userfaultfd permission; a paused one from its pause layer (paused-branch.ts, no VM involved). The
 * sandbox's record follows its branches (its chain, the last branch, a BRANCH that blocks the next), and a
 * named branch moves its template alias.
 */

import { conflict, ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { allowUnprivilegedUserfaultfd } from "../../isolation/userfaultfd.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";
import type { BranchOutcome } from "../sandbox-service.js";
import {
  type BranchEvents,
  Brancher,
  type BranchRequest,
  interruptedBranchTag,
} from "../snapshots/branch.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import { assertAlias } from "../snapshots/template-aliases.js";
import type { Admission } from "./admission.js";
import { COLD_BOOTED_REASON } from "./filesystem-pause.js";
import type { KeyedLock } from "./keyed-lock.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import { branchPausedState } from "./paused-branch.js";
import type { SnapshotCollection } from "./snapshot-collection.js";

export type SandboxBranchRequest = BranchRequest & { alias?: string };

export interface BranchingContext {
  paths: ForkdPaths;
  db: StateDb;
  live: LiveSandboxes;
  locks: KeyedLock;
  snapshots: Pick<DaemonSnapshots, "store" | "get" | "aliases" | "markEphemeral">;
  admission: Pick<Admission, "reserveMemory">;
  collection: Pick<SnapshotCollection, "request">;
  /** Host-wide cap on BRANCHes in flight (`--branch-concurrency`); undefined: MAX_CONCURRENT_BRANCHES. */
  branchConcurrency: number | undefined;
  /** false: never set vm.unprivileged_userfaultfd=1 for a live BRANCH (then such a BRANCH is refused). */
  allowUnprivilegedUserfaultfd: boolean | undefined;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

export class Branching {
  readonly brancher: Brancher;

  constructor(private readonly ctx: BranchingContext) {
    this.brancher = new Brancher(ctx.snapshots.store, ctx.db, this.recordEvents(), ctx.branchConcurrency);
  }

  /** How the sandbox's record follows its branches. */
  private recordEvents(): BranchEvents {
    const { db } = this.ctx;
    return {
      blocked: (sandboxId, reason) => db.updateSandbox(sandboxId, { branch_blocked: reason }),
      unblocked: (sandboxId) => db.updateSandbox(sandboxId, { branch_blocked: null }),
      branched: (sandboxId, tag) => {
        const current = db.sandbox(sandboxId);
        if (!current) return;
        const layers = [...(JSON.parse(current.layer_tags) as string[]), tag];
        // Its pause layers are now under the branch's: part of a chain others depend on, no longer its own.
        db.updateSandbox(sandboxId, {
          last_branch_tag: tag,
          layer_tags: JSON.stringify(layers),
          branch_blocked: null,
          pause_tags: "[]",
        });
      },
    };
  }

  /** BRANCHes admitted and not yet answered, and the host-wide cap on them. */
  load(): { inFlight: number; cap: number } {
    return { inFlight: this.brancher.inFlight, cap: this.brancher.concurrencyCap };
  }

  /** Snapshots sandbox `id` mid-work; it keeps running (or stays paused). See snapshots/branch.ts. */
  async branch(id: string, request: SandboxBranchRequest = {}): Promise<BranchOutcome> {
    this.ctx.live.row(id);
    if (request.alias !== undefined) assertAlias(request.alias);
    return this.ctx.locks.run(id, () => this.branchNow(id, request));
  }

  private async branchNow(id: string, request: SandboxBranchRequest): Promise<BranchOutcome> {
    const row = this.ctx.live.row(id);
    if (row.kept_disk !== null) {
      throw conflict(
        `sandbox ${id} is paused without memory (a filesystem-only pause): it has no state to branch, fork or snapshot; resume it first`,
      );
    }
    if (row.cold_booted === 1) throw conflict(`sandbox ${id} cannot be branched: ${COLD_BOOTED_REASON}`);
    if (row.status === "paused")
      return this.named(await this.branchPaused(row, request), request.alias, row.owner);
    const live = this.ctx.live.running(id);
    // The mark of a BRANCH this process is running is no obstacle: branches of one source queue behind each other.
    const inFlight = this.brancher.isBranching(id) && interruptedBranchTag(row.branch_blocked) !== null;
    if (row.branch_blocked && !inFlight) {
      throw conflict(`sandbox ${id} cannot be branched again: ${row.branch_blocked}`);
    }
    const { alias, ...branchRequest } = request;
    // The copy of the source's private pages is held in memory: at most its whole RAM.
    const ramBytes = (await this.ctx.snapshots.store.get(row.snapshot_tag)).manifest.memory.ramBytes;
    const buffer = this.ctx.admission.reserveMemory(ramBytes / 2 ** 20, `a BRANCH of ${id}`);
    let result: Awaited<ReturnType<Brancher["branch"]>>;
    try {
      result = await this.brancher.branch(
        {
          handle: live.handle,
          lastBranchTag: row.last_branch_tag,
          liveFork: row.live_fork === 1,
          owner: row.owner,
          beforeLive: () => this.allowLiveCapture(live.handle),
        },
        branchRequest,
      );
    } finally {
      buffer.release();
    }
    return this.named({ ...result, snapshot: await this.ctx.snapshots.get(result.tag) }, alias, row.owner);
  }

  /**
   * Points template alias `alias` (if given) at the branch's snapshot, as the branched sandbox's owner's name
   * (like the snapshot); the one it named before goes once unused.
   */
  private async named(
    outcome: BranchOutcome,
    alias: string | undefined,
    owner: string | null,
  ): Promise<BranchOutcome> {
    if (alias === undefined) return outcome;
    const { snapshots } = this.ctx;
    const previous = (await snapshots.aliases.list()).find((a) => a.alias === alias)?.tag;
    await snapshots.aliases.set(alias, outcome.tag, owner);
    // The name moved on: its earlier snapshot goes once nothing else needs it.
    if (previous !== undefined && previous !== outcome.tag) {
      snapshots.markEphemeral(previous, `superseded as ${alias}`);
      this.ctx.collection.request();
    }
    return { ...outcome, snapshot: await snapshots.get(outcome.tag) };
  }

  /** A BRANCH of a paused sandbox: a snapshot of its paused state (paused-branch.ts), no VM involved. */
  private async branchPaused(row: SandboxRow, request: BranchRequest): Promise<BranchOutcome> {
    const pauseTag = (JSON.parse(row.pause_tags) as string[]).at(-1) ?? row.last_branch_tag;
    if (!pauseTag) throw new ForkdError("internal", `paused sandbox ${row.id} has no pause layer recorded`);
    const result = await branchPausedState(this.ctx.paths, this.ctx.db, {
      sandboxId: row.id,
      pauseTag,
      tag: request.tag,
      mode: request.mode,
      parentTag: request.parentTag,
      signal: request.signal,
      owner: row.owner,
    });
    return { ...result, snapshot: await this.ctx.snapshots.get(result.tag) };
  }

  /** A live BRANCH of a confined QEMU needs the host to let it create its userfaultfd (isolation/userfaultfd.ts). */
  private async allowLiveCapture(handle: SandboxHandle): Promise<void> {
    if (handle.vmOwner === null) return;
    if (this.ctx.allowUnprivilegedUserfaultfd === false) {
      throw new ForkdError(
        "not_implemented",
        `a live BRANCH of ${handle.id} needs vm.unprivileged_userfaultfd=1 for its unprivileged QEMU, which this ` +
          "daemon was told not to set (--no-unprivileged-userfaultfd); use mode diff",
      );
    }
    if (await allowUnprivilegedUserfaultfd()) {
      this.ctx.log.warn(
        { sysctl: "vm.unprivileged_userfaultfd=1" },
        "enabled unprivileged userfaultfd for live BRANCH of confined QEMUs (see docs/security.md)",
      );
    }
  }
}
