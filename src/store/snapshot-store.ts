/**
 * Snapshots on disk. A snapshot is written into a staging directory and renamed into place when complete,
 * so readers only ever see complete snapshots; deletion renames first and removes after, for the same reason.
 */
import { randomBytes } from "node:crypto";
import { chmod, mkdir, readdir, readFile, rename, rm, stat, statfs } from "node:fs/promises";
import path from "node:path";
import { fsyncPath, writeDurably } from "../common/durable-fs.js";
import { conflict, ForkdError, notFound } from "../common/errors.js";
import { assertTag, isValidTag } from "../common/names.js";
import { OWNER_TOKEN_PATTERN, ownerTokenAlive, selfOwnerToken } from "../common/processes.js";
import { digestFile } from "./hash.js";
import { MANIFEST_FILE, MANIFEST_FORMAT, parseManifest, type SnapshotManifest } from "./manifest.js";

const STAGING_PREFIX = ".staging-";
/** A published snapshot moved aside by a replace, until the new version is in place. */
const REPLACED_PREFIX = ".replaced-";
const DELETING_PREFIX = ".deleting-";

export interface StoredSnapshot {
  tag: string;
  dir: string;
  manifest: SnapshotManifest;
}

export type ManifestDraft = Omit<SnapshotManifest, "format" | "tag" | "files" | "createdAtUnix">;

export class SnapshotStore {
  constructor(readonly root: string) {}

  dirOf(tag: string): string {
    return path.join(this.root, assertTag(tag));
  }

  async list(): Promise<StoredSnapshot[]> {
    let names: string[];
    try {
      names = await readdir(this.root);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw err;
    }
    const out: StoredSnapshot[] = [];
    for (const name of names.sort()) {
      if (name.startsWith(".")) continue;
      try {
        out.push(await this.get(name));
      } catch {
        // A directory without a valid manifest is not a snapshot; `get` reports why when asked directly.
      }
    }
    return out;
  }

  async get(tag: string): Promise<StoredSnapshot> {
    const dir = this.dirOf(tag);
    let text: string;
    try {
      text = await readFile(path.join(dir, MANIFEST_FILE), "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT")
        throw notFound(`snapshot ${JSON.stringify(tag)} not found`);
      throw err;
    }
    return { tag, dir, manifest: parseManifest(text, `snapshot ${tag}`) };
  }

  /** True when a directory for `tag` exists, whether or not its manifest is valid. */
  async exists(tag: string): Promise<boolean> {
    try {
      await stat(this.dirOf(tag));
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw err;
    }
  }

  /**
   * Starts writing `tag` in a private staging directory. Fails early if the tag exists and `replace` is off, and
   * with `unavailable` if the disk cannot hold `expectedBytes` more (see reserveDisk).
   */
  async beginWrite(
    tag: string,
    options: { replace?: boolean; expectedBytes?: number } = {},
  ): Promise<SnapshotWriter> {
    assertTag(tag);
    if (!options.replace && (await this.exists(tag))) {
      throw conflict(`snapshot ${JSON.stringify(tag)} already exists (delete it first, or replace it)`);
    }
    await mkdir(this.root, { recursive: true, mode: 0o700 });
    const disk = await this.reserveDisk(options.expectedBytes ?? 0, `snapshot ${tag}`);
    try {
      return new SnapshotWriter(this, tag, await this.makeStagingDir(tag), options.replace ?? false, disk);
    } catch (err) {
      disk.release();
      throw err;
    }
  }

  /**
   * Disk admission: refuses (`unavailable`) work that would leave less than DISK_RESERVE_BYTES free on the
   * store's filesystem, counting what other writes of this process have reserved and not finished. Without it a
   * snapshot, BRANCH, compaction or unpack fills the disk halfway and fails there, or takes the host down with it.
   */
  async reserveDisk(bytes: number, what: string): Promise<DiskReservation> {
    const fs = await statfs(this.root);
    const free = Number(fs.bavail) * Number(fs.bsize);
    const reserve = diskReserveBytes();
    const promised = diskReserved.get(this.root) ?? 0;
    if (free - promised - bytes < reserve) {
      const mib = (n: number) => Math.round(n / 2 ** 20);
      throw new ForkdError(
        "unavailable",
        `not enough disk for ${what}: ${mib(free)} MiB free` +
          (promised > 0 ? ` (${mib(promised)} MiB promised to writes in progress)` : "") +
          `, it needs up to ${mib(bytes)} MiB and ${mib(reserve)} MiB must stay free (FORKD_DISK_RESERVE_MIB)`,
      );
    }
    diskReserved.set(this.root, promised + bytes);
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        diskReserved.set(this.root, (diskReserved.get(this.root) ?? bytes) - bytes);
      },
    };
  }

  /**
   * A private (0700) staging directory under the store, on the same filesystem (so what is staged can be renamed
   * into place) and named after its owner, so sweepStale removes it once this process is gone.
   */
  async makeStagingDir(label: string): Promise<string> {
    await mkdir(this.root, { recursive: true, mode: 0o700 });
    const staging = path.join(this.root, `${STAGING_PREFIX}${label}-${ownedSuffix()}`);
    await mkdir(staging, { mode: 0o700 });
    return staging;
  }

  async delete(tag: string): Promise<void> {
    const dir = this.dirOf(tag);
    const doomed = path.join(this.root, `${DELETING_PREFIX}${tag}-${ownedSuffix()}`);
    try {
      await rename(dir, doomed);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT")
        throw notFound(`snapshot ${JSON.stringify(tag)} not found`);
      throw err;
    }
    await rm(doomed, { recursive: true, force: true });
  }

  /**
   * Cleans up after processes that died mid-write: staging and half-deleted directories are removed; a snapshot
   * moved aside by a replace whose new version never arrived is put back (so a crash during a replace loses
   * neither the old nor, once published, the new). `beforeRemove` runs first on each staging directory, so
   * whatever still runs on its files (a parent VM mapping its memory file) is stopped before they go.
   */
  async sweepStale(beforeRemove?: (dir: string) => Promise<void>): Promise<string[]> {
    let names: string[];
    try {
      names = await readdir(this.root);
    } catch {
      return [];
    }
    const swept: string[] = [];
    for (const name of names) {
      const kind = [STAGING_PREFIX, DELETING_PREFIX, REPLACED_PREFIX].find((p) => name.startsWith(p));
      if (kind === undefined) continue;
      const owned = new RegExp(`^${kind.replace(".", "\\.")}(.+)-${OWNER_TOKEN_PATTERN}-[0-9a-f]{8}$`).exec(
        name,
      );
      const token = owned ? `${owned[2]}.${owned[3]}.${owned[4]}` : null;
      if (token !== null && (await ownerTokenAlive(token))) continue;
      const dir = path.join(this.root, name);
      const tag = owned?.[1];
      if (kind === REPLACED_PREFIX && tag !== undefined && isValidTag(tag) && !(await this.exists(tag))) {
        await rename(dir, this.dirOf(tag));
        swept.push(name);
        continue;
      }
      if (kind === STAGING_PREFIX) await beforeRemove?.(dir);
      await rm(dir, { recursive: true, force: true });
      swept.push(name);
    }
    return swept;
  }

  /**
   * Moves published snapshot `tag` aside before a new version takes its place; returns where it went (null if
   * there was none). Until the caller removes it, a crash is survivable: if the new version never arrived,
   * sweepStale puts this one back.
   */
  async moveAside(tag: string): Promise<string | null> {
    const aside = path.join(this.root, `${REPLACED_PREFIX}${tag}-${ownedSuffix()}`);
    try {
      await rename(this.dirOf(tag), aside);
      return aside;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw err;
    }
  }

  /** @internal used by SnapshotWriter */
  async publish(tag: string, staging: string, replace: boolean): Promise<void> {
    const final = this.dirOf(tag);
    if (replace) {
      const doomed = await this.moveAside(tag);
      await rename(staging, final);
      if (doomed) await rm(doomed, { recursive: true, force: true });
      return;
    }
    try {
      await rename(staging, final);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ENOTEMPTY" || code === "EEXIST") {
        throw conflict(`snapshot ${JSON.stringify(tag)} was created by someone else meanwhile`);
      }
      throw err;
    }
  }
}

export class SnapshotWriter {
  private done = false;

  constructor(
    private readonly store: SnapshotStore,
    readonly tag: string,
    /** Write the snapshot's files here. */
    readonly dir: string,
    private readonly replace: boolean,
    private readonly disk: DiskReservation = { release: () => {} },
  ) {}

  file(name: string): string {
    return path.join(this.dir, name);
  }

  /**
   * Hashes `dataFiles`, makes them read-only, writes the manifest durably and renames the staging directory
   * into place. After this the snapshot is visible and immutable.
   */
  async commit(draft: ManifestDraft, dataFiles: string[], signal?: AbortSignal): Promise<SnapshotManifest> {
    const files: SnapshotManifest["files"] = {};
    for (const name of dataFiles) {
      files[name] = await digestFile(this.file(name), signal);
      await fsyncPath(this.file(name));
      await chmod(this.file(name), 0o444);
    }
    const manifest: SnapshotManifest = {
      format: MANIFEST_FORMAT,
      tag: this.tag,
      createdAtUnix: Math.floor(Date.now() / 1000),
      ...draft,
      files,
    };
    await writeDurably(this.file(MANIFEST_FILE), `${JSON.stringify(manifest, null, 2)}\n`);
    await fsyncPath(this.dir);
    signal?.throwIfAborted();
    await this.store.publish(this.tag, this.dir, this.replace);
    await fsyncPath(path.dirname(this.dir));
    this.done = true;
    this.disk.release();
    return manifest;
  }

  /** Removes the staging directory. Safe to call after a failed or successful commit. */
  async abort(): Promise<void> {
    if (this.done) return;
    this.done = true;
    this.disk.release();
    await rm(this.dir, { recursive: true, force: true });
  }
}

export interface DiskReservation {
  release(): void;
}

/** Disk that must stay free under FORKD_HOME: 1 GiB unless FORKD_DISK_RESERVE_MIB says otherwise. */
export const DEFAULT_DISK_RESERVE_MIB = 1024;

function diskReserveBytes(): number {
  const raw = process.env.FORKD_DISK_RESERVE_MIB;
  const mib = raw === undefined ? DEFAULT_DISK_RESERVE_MIB : Number(raw);
  if (!Number.isInteger(mib) || mib < 0) {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_DISK_RESERVE_MIB must be a whole number of MiB, not ${raw}`,
    );
  }
  return mib * 2 ** 20;
}

/** Bytes reserved by writes in progress in this process, per store root. */
const diskReserved = new Map<string, number>();

/** "<owner token>-<random>": whose the directory is, and unique among that owner's. */
function ownedSuffix(): string {
  return `${selfOwnerToken()}-${randomBytes(4).toString("hex")}`;
}
