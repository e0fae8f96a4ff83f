/**
 * What snapshot creation needs of the daemon's admission (sandboxes/admission.ts implements it): a slot per
 * parent boot (host-wide and per tenant) and the parent VM's memory. Declared here so snapshots do not depend on
 * the sandboxes folder.
 */
export interface ParentBootAdmission {
  reserveParentBoot(tenant: string | null): { release(): void };
  reserveMemory(mib: number, what: string): { release(): void };
}

/** Snapshots as the daemon serves them: the ready ones on disk plus the ones being written or failed. */

import { createWriteStream } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, errorMessage, ForkdError, invalidArgument, notFound } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { imageOfFiles } from "../../image/index.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import { jobWriterAlive, type StateDb } from "../../store/db.js";
import { sweepDeadPackScratch } from "../../store/pack-archive.js";
import { SnapshotStore, type StoredSnapshot } from "../../store/snapshot-store.js";
import { snapshotIsBootable } from "../machines/restore-plan.js";
import type {
  PackRequest,
  PackResult,
  RegistryPullRequest,
  RegistryPullResult,
  RegistryPushRequest,
  RegistryPushResult,
  SnapshotCreateRequest,
  SnapshotDeleteOptions,
  SnapshotDetail,
  SnapshotInfo,
  SnapshotService,
  UnpackRequest,
  UnpackResult,
} from "../sandbox-service.js";
import { chainDetail, compactSnapshot, emptyChainDetail, originFacts, removeSnapshot } from "./chains.js";
import {
  type CreateSnapshotOptions,
  createSnapshot,
  type ProgressEvent,
  sweepStaleSnapshotFiles,
} from "./create.js";
import { packSnapshot } from "./pack.js";
import { pullSnapshot, pushSnapshot } from "./registry.js";
import { type ResolvedTemplate, TemplateAliases } from "./template-aliases.js";
import { unpackSnapshot } from "./unpack.js";

export class DaemonSnapshots implements SnapshotService {
  readonly store: SnapshotStore;
  private readonly templateAliases: TemplateAliases;
  private readonly imageDirs: readonly string[];
  private readonly beforeDelete: ((tag: string) => Promise<() => void>) | undefined;

  private readonly confinement: ConfinementConfig | undefined;
  private readonly admission: ParentBootAdmission | undefined;

  constructor(
    private readonly paths: ForkdPaths,
    private readonly db: StateDb,
    /** Ids of live sandboxes restored from `tag` (a snapshot they map cannot be deleted). */
    private readonly usersOf: (tag: string) => string[],
    options: {
      /**
       * Runs before a delete (a warm pool drains the snapshot's prestarted VMs); the function it returns
       * undoes that when the delete is refused.
       */
      beforeDelete?: (tag: string) => Promise<() => void>;
      defaultSnapshot?: string;
      /** Image caches whose images a v0.5 client may name by kernel/rootfs path (default: this host's cache). */
      imageDirs?: readonly string[];
      /** How parent VMs are confined (the daemon's). */
      confinement?: ConfinementConfig;
      /** The daemon's admission control: parent boots take a slot (host-wide, per tenant) and their memory. */
      admission?: ParentBootAdmission;
    } = {},
  ) {
    this.confinement = options.confinement;
    this.admission = options.admission;
    this.store = new SnapshotStore(paths.snapshots);
    this.beforeDelete = options.beforeDelete;
    this.imageDirs = options.imageDirs ?? [paths.images];
    this.templateAliases = new TemplateAliases(db, this.store, options.defaultSnapshot);
  }

  readonly aliases: SnapshotService["aliases"] = {
    list: async () => this.templateAliases.list(),
    get: async (alias) => this.templateAliases.get(alias),
    set: (alias, tag, owner) => this.templateAliases.set(alias, tag, owner),
    delete: (alias) => this.templateAliases.delete(alias),
  };

  resolveTemplate(name: string, options: { orDefault?: boolean } = {}): Promise<ResolvedTemplate> {
    return this.templateAliases.resolve(name, options);
  }

  defaultTemplate(): Promise<string | null> {
    return this.templateAliases.defaultTag();
  }

  /**
   * Retires a snapshot: its aliases go now, the snapshot itself now if nothing needs it, else as soon as nothing
   * does (a sandbox still runs on it, or another snapshot depends on it). not_found if unknown.
   */
  async retire(tag: string): Promise<"deleted" | "deferred"> {
    await this.get(tag);
    for (const alias of this.templateAliases.namesOf(tag)) this.templateAliases.delete(alias);
    try {
      await this.delete(tag);
      return "deleted";
    } catch (err) {
      if (!(err instanceof ForkdError && err.code === "conflict")) throw err;
      this.markEphemeral(tag, "retired while still needed");
      return "deferred";
    }
  }

  /** Marks a snapshot the daemon made for itself: collectEphemeral() deletes it once nothing needs it. */
  markEphemeral(tag: string, reason: string): void {
    this.db.markEphemeral({ tag, reason, created_at_unix: Math.floor(Date.now() / 1000) });
  }

  /**
   * Deletes the daemon's own snapshots that no sandbox runs on, no alias names and no other snapshot depends
   * on (newest first, so a chain of them goes leaves first). Returns the tags deleted.
   */
  async collectEphemeral(): Promise<string[]> {
    const deleted: string[] = [];
    const named = new Set(this.db.aliases().map((a) => a.tag));
    for (const row of this.db.ephemeralSnapshots()) {
      if (named.has(row.tag) || this.usersOf(row.tag).length > 0) continue;
      if (!(await this.store.exists(row.tag))) {
        this.db.forgetEphemeral(row.tag);
        continue;
      }
      try {
        await removeSnapshot(this.paths, row.tag, { sandboxesOf: this.usersOf });
        this.db.forgetEphemeral(row.tag);
        this.db.setSnapshotOwner(row.tag, null);
        deleted.push(row.tag);
      } catch (err) {
        // Still depended on (another snapshot, a VM outside the daemon): tried again on a later sweep.
        if (!(err instanceof ForkdError && err.code === "conflict")) throw err;
      }
    }
    return deleted;
  }

  /** Start-up: a snapshot still "writing" belongs to a daemon that is gone; mark it failed, sweep its files. */
  async reconcile(): Promise<void> {
    for (const job of this.db.snapshotJobs()) {
      if (job.status === "writing" && !(await jobWriterAlive(job))) {
        this.db.upsertSnapshotJob({
          ...job,
          status: "failed",
          error: "the daemon stopped while it was being written",
        });
      }
    }
    await sweepStaleSnapshotFiles(this.store);
    // Packs in transit belong to requests of a daemon that is gone; so do the link farms of packs it wrote.
    await rm(this.paths.transfers, { recursive: true, force: true });
    await sweepDeadPackScratch();
  }

  async list(): Promise<SnapshotInfo[]> {
    // Jobs first: a write that completes in between then shows as ready (its job row is deleted only after the
    // snapshot is published), never as missing.
    const allJobs = this.db.snapshotJobs();
    const owners = this.db.snapshotOwners();
    const ready = await Promise.all((await this.store.list()).map((s) => this.describe(s, owners)));
    const readyTags = new Set(ready.map((s) => s.tag));
    const jobs = allJobs.filter((j) => !readyTags.has(j.tag));
    return [
      ...ready,
      ...jobs.map(
        (j): SnapshotInfo => ({
          tag: j.tag,
          created_at_unix: j.started_at_unix,
          status: j.status,
          bootable: false,
          template: null,
          accelerator: null,
          memory_mib: null,
          parent_tag: null,
          bytes: 0,
          error: j.error,
          vcpus: null,
          source_sandbox: null,
          aliases: [],
          ephemeral: false,
          owner: owners.get(j.tag) ?? null,
          origin: null,
          branch_mode: null,
          disk_bytes: 0,
          egress_default: null,
        }),
      ),
    ].sort((a, b) => a.tag.localeCompare(b.tag));
  }

  async get(tag: string): Promise<SnapshotInfo> {
    assertTag(tag);
    const found = (await this.list()).find((s) => s.tag === tag);
    if (!found) throw notFound(`snapshot ${JSON.stringify(tag)} not found`);
    return found;
  }

  /** The snapshot to restore children from: not_found if unknown, conflict if not (yet) bootable. */
  async bootable(tag: string): Promise<StoredSnapshot> {
    assertTag(tag);
    const job = this.db.snapshotJob(tag);
    if (job?.status === "writing") throw conflict(`snapshot ${JSON.stringify(tag)} is still being written`);
    let snapshot: StoredSnapshot;
    try {
      snapshot = await this.store.get(tag);
    } catch (err) {
      if (job?.status === "failed" && err instanceof ForkdError && err.code === "not_found") {
        throw conflict(
          `snapshot ${JSON.stringify(tag)} failed and is not bootable: ${job.error ?? "unknown error"}`,
        );
      }
      throw err;
    }
    const problem = await snapshotIsBootable(snapshot);
    if (problem) throw conflict(`snapshot ${JSON.stringify(tag)} is not bootable: ${problem}`);
    return snapshot;
  }

  async create(request: SnapshotCreateRequest): Promise<SnapshotInfo> {
    const tag = assertTag(request.tag);
    if (request.image !== undefined && request.template !== undefined) {
      throw invalidArgument("give template, or kernel and rootfs, not both");
    }
    // Taken before the first await: a burst of creates cannot slip past the bound (admission.ts).
    const slot = this.admission?.reserveParentBoot(request.owner ?? null);
    try {
      return await this.createAdmitted(tag, request);
    } finally {
      slot?.release();
    }
  }

  private async createAdmitted(tag: string, request: SnapshotCreateRequest): Promise<SnapshotInfo> {
    // Refused before a job row exists: a path outside the allowlist leaves no trace.
    const image = request.image === undefined ? undefined : await imageOfFiles(request.image, this.imageDirs);
    return this.write(
      tag,
      request.owner ?? null,
      {
        ...(image ? { image } : { template: request.template ?? tag }),
        signal: request.signal,
      },
      true,
    );
  }

  /**
   * A snapshot of a template file the daemon wrote itself (a template build's, controller/builds/), never one a
   * caller named: the file must be under `buildsDir`. `force` builds every step again.
   */
  async createFromBuild(request: {
    tag: string;
    templateFile: string;
    buildsDir: string;
    owner: string | null;
    force?: boolean;
    onProgress?: (event: ProgressEvent) => void;
    signal?: AbortSignal;
  }): Promise<SnapshotInfo> {
    const tag = assertTag(request.tag);
    const relative = path.relative(request.buildsDir, request.templateFile);
    if (relative.startsWith("..") || path.isAbsolute(relative)) {
      throw invalidArgument("a build's template file must be in the daemon's builds directory");
    }
    return this.write(
      tag,
      request.owner,
      {
        template: request.templateFile,
        templateFiles: true,
        force: request.force,
        onProgress: request.onProgress,
        signal: request.signal,
      },
      false,
    );
  }

  /**
   * `admitParent`: the parent VM's memory is reserved through admission here; a template build reserves its own
   * (controller/builds, which also queues builds instead of refusing them).
   */
  private async write(
    tag: string,
    owner: string | null,
    options: Omit<CreateSnapshotOptions, "tag" | "confinement" | "admitBoot">,
    admitParent: boolean,
  ): Promise<SnapshotInfo> {
    if (await this.store.exists(tag)) throw conflict(`snapshot ${JSON.stringify(tag)} already exists`);
    const claimed = this.db.claimSnapshotJob({
      tag,
      status: "writing",
      kind: "template",
      started_at_unix: Math.floor(Date.now() / 1000),
      error: null,
      owner,
    });
    if (!claimed) throw conflict(`snapshot ${JSON.stringify(tag)} is already being written`);
    crashPoint("snapshot.claimed");
    const admission = admitParent ? this.admission : undefined;
    let refusedByAdmission = false;
    const admitBoot =
      admission &&
      ((mib: number) => {
        try {
          return admission.reserveMemory(mib, `the parent VM of ${tag}`);
        } catch (err) {
          refusedByAdmission = true;
          throw err;
        }
      });
    try {
      await createSnapshot(this.paths, { tag, ...options, confinement: this.confinement, admitBoot });
      crashPoint("snapshot.committed");
      this.db.deleteSnapshotJob(tag);
    } catch (err) {
      // A request that was invalid from the start, or that admission refused, leaves no trace; a failed build
      // is kept as "failed".
      if (
        refusedByAdmission ||
        (err instanceof ForkdError && ["invalid_argument", "not_found", "conflict"].includes(err.code))
      ) {
        this.db.deleteSnapshotJob(tag);
      } else {
        this.db.upsertSnapshotJob({
          tag,
          status: "failed",
          kind: "template",
          started_at_unix: Math.floor(Date.now() / 1000),
          error: errorMessage(err).split("\n")[0] ?? "failed",
        });
      }
      throw err;
    }
    return this.get(tag);
  }

  async detail(tag: string): Promise<SnapshotDetail> {
    const info = await this.get(tag);
    if (info.status !== "ready") {
      return { ...info, ...emptyChainDetail(), chain_error: info.error };
    }
    const { tag: _tag, parent_tag: _parent, ...chain } = await chainDetail(this.paths, tag);
    return { ...info, ...chain };
  }

  /** See SnapshotService.delete; the chain rules live in chains.ts (removeSnapshot). */
  async delete(tag: string, options: SnapshotDeleteOptions = {}): Promise<string[]> {
    assertTag(tag);
    const job = this.db.snapshotJob(tag);
    if (job?.status === "writing") throw conflict(`snapshot ${JSON.stringify(tag)} is being written`);
    if (job && !(await this.store.exists(tag))) {
      this.db.deleteSnapshotJob(tag);
      this.db.setSnapshotOwner(tag, null);
      return [tag];
    }
    const undo = await this.beforeDelete?.(tag);
    let deleted: string[];
    try {
      deleted = await removeSnapshot(this.paths, tag, { ...options, sandboxesOf: this.usersOf });
    } catch (err) {
      undo?.();
      throw err;
    }
    if (job) this.db.deleteSnapshotJob(tag);
    for (const gone of deleted) this.db.setSnapshotOwner(gone, null);
    return deleted;
  }

  async compact(request: {
    from: string;
    to: string;
    owner?: string | null;
    signal?: AbortSignal;
  }): Promise<SnapshotInfo> {
    const to = assertTag(request.to, "to");
    assertTag(request.from);
    if (await this.store.exists(to)) throw conflict(`snapshot ${JSON.stringify(to)} already exists`);
    const claimed = this.db.claimSnapshotJob({
      tag: to,
      status: "writing",
      kind: "compact",
      started_at_unix: Math.floor(Date.now() / 1000),
      error: null,
      owner: request.owner ?? null,
    });
    if (!claimed) throw conflict(`snapshot ${JSON.stringify(to)} is already being written`);
    crashPoint("compact.claimed");
    try {
      await compactSnapshot(this.paths, { from: request.from, to, signal: request.signal });
      crashPoint("compact.committed");
    } finally {
      // A failed compaction leaves nothing behind (it was staged): the tag is simply free again.
      this.db.deleteSnapshotJob(to);
    }
    return this.get(to);
  }

  /**
   * Packs the chain ending at `tag` (with its guest image unless `withoutImage`) into a file of its own under the
   * transfers directory; the caller sends it and calls `dispose`.
   */
  async pack(request: PackRequest): Promise<{ file: string; result: PackResult; dispose(): Promise<void> }> {
    const tag = assertTag(request.tag);
    const dir = await this.transferDir("pack-");
    const dispose = () => rm(dir, { recursive: true, force: true });
    try {
      const file = path.join(dir, `${tag}.tar.zst`);
      const result = await packSnapshot(this.paths, {
        tag,
        out: file,
        level: request.level,
        withoutImage: request.withoutImage,
        signal: request.signal,
      });
      return { file, result, dispose };
    } catch (err) {
      await dispose();
      throw err;
    }
  }

  /**
   * Receives a pack (at most `maxBytes`) into the transfers directory, then verifies and installs it, all or
   * nothing (unpack.ts: a pack is hostile input). The received file is removed either way.
   */
  async unpack(request: UnpackRequest): Promise<UnpackResult> {
    const dir = await this.transferDir("unpack-");
    try {
      const file = path.join(dir, "pack.tar.zst");
      await receive(request.body, file, request.maxBytes, request.signal);
      crashPoint("unpack.received");
      const result = await unpackSnapshot(this.paths, {
        file,
        tag: request.tag,
        force: request.force,
        sandboxesOf: this.usersOf,
        signal: request.signal,
      });
      // Only admins unpack (tenancy/tenant-view.ts): what it wrote is an admin's, whoever held those tags before.
      for (const tag of [...result.installed, ...result.replaced]) this.db.setSnapshotOwner(tag, null);
      return result;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * Pulls a chain from a registry (registry.ts: the unpack checks, then installed all or nothing); with
   * `digest`, a registry manifest of another digest is refused before anything is downloaded.
   */
  async pull(request: RegistryPullRequest): Promise<RegistryPullResult> {
    const result = await pullSnapshot(this.paths, {
      reference: request.reference,
      expectDigest: request.digest,
      tag: request.tag,
      insecure: request.insecure,
      sandboxesOf: this.usersOf,
      signal: request.signal,
    });
    // Only admins pull (tenancy/tenant-view.ts): what it wrote is an admin's unless the admin names its owner
    // (the cluster gateway does, for a tenant's fork moved to another node).
    for (const tag of [...result.installed, ...result.replaced])
      this.db.setSnapshotOwner(tag, request.owner ?? null);
    return result;
  }

  async push(request: RegistryPushRequest): Promise<RegistryPushResult> {
    const pushed = await pushSnapshot(this.paths, {
      tag: assertTag(request.tag),
      reference: request.reference,
      insecure: request.insecure,
      withoutImage: request.withoutImage,
      signal: request.signal,
    });
    return {
      reference: pushed.reference,
      digest: pushed.digest,
      chain: pushed.chain,
      uploaded_bytes: pushed.uploaded_bytes,
      ms: pushed.ms,
    };
  }

  private async transferDir(prefix: string): Promise<string> {
    await mkdir(this.paths.transfers, { recursive: true, mode: 0o700 });
    return mkdtemp(path.join(this.paths.transfers, prefix));
  }

  private async describe(s: StoredSnapshot, owners: Map<string, string>): Promise<SnapshotInfo> {
    const problem = await snapshotIsBootable(s);
    const ephemeral = this.db.ephemeralSnapshots().some((row) => row.tag === s.tag);
    return {
      tag: s.tag,
      created_at_unix: s.manifest.createdAtUnix,
      status: "ready",
      bootable: problem === null,
      template: s.manifest.template.name,
      accelerator: s.manifest.machine.accel,
      memory_mib: s.manifest.machine.memoryMiB,
      parent_tag: s.manifest.parent?.tag ?? null,
      bytes: Object.values(s.manifest.files).reduce((sum, f) => sum + f.size, 0),
      error: problem,
      vcpus: s.manifest.machine.vcpus,
      source_sandbox: s.manifest.origin.sourceSandbox,
      aliases: this.templateAliases.namesOf(s.tag),
      ephemeral,
      owner: owners.get(s.tag) ?? null,
      ...(await originFacts(s)),
      egress_default: s.manifest.template.egress ?? null,
    };
  }
}

/** Writes `body` to `file`, refusing (payload_too_large) beyond `maxBytes`. */
async function receive(
  body: AsyncIterable<Buffer>,
  file: string,
  maxBytes: number,
  signal: AbortSignal | undefined,
): Promise<void> {
  let received = 0;
  async function* bounded() {
    for await (const chunk of body) {
      received += chunk.length;
      if (received > maxBytes) {
        throw new ForkdError("payload_too_large", `the pack is larger than ${maxBytes} bytes`);
      }
      yield chunk;
    }
  }
  await pipeline(bounded(), createWriteStream(file, { flags: "wx", mode: 0o600 }), { signal });
}
