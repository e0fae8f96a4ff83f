/**
 * Which registry digest each local snapshot is: recorded when the node pulls a snapshot (or pushes one), so its
 * ForkdNode can say which snapshots it holds by digest, the key placement matches. Kept in one small JSON file
 * of the node's home, replaced atomically. A record names the snapshot's creation time as well: a tag deleted
 * and made again is not taken for the snapshot that was pulled.
 */
import { mkdir, readFile } from "node:fs/promises";
import path from "node:path";
import { replaceFile } from "../common/durable-fs.js";

export interface DigestRecord {
  digest: string;
  reference: string;
  /** The snapshot's created_at_unix when it was recorded. */
  created_at_unix: number;
}

const FILE_NAME = "held-digests.json";
/** More records than snapshots a node may hold (CLUSTER_LIMITS.snapshotsPerNode) would only be garbage. */
const MAX_RECORDS = 4096;

export class HeldDigests {
  private records = new Map<string, DigestRecord>();
  private writing: Promise<void> = Promise.resolve();

  private constructor(private readonly file: string) {}

  static async open(dir: string): Promise<HeldDigests> {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const held = new HeldDigests(path.join(dir, FILE_NAME));
    const text = await readFile(held.file, "utf8").catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return "{}";
      throw err;
    });
    try {
      const parsed = JSON.parse(text) as Record<string, DigestRecord>;
      for (const [tag, record] of Object.entries(parsed).slice(0, MAX_RECORDS)) {
        if (typeof record?.digest === "string" && typeof record.created_at_unix === "number") {
          held.records.set(tag, record);
        }
      }
    } catch {
      // A torn file (it is replaced atomically, so only by hand) is as good as none: pulls record again.
    }
    return held;
  }

  /** The record of `tag` if it still describes the snapshot of that tag made at `createdAtUnix`. */
  of(tag: string, createdAtUnix: number): DigestRecord | undefined {
    const record = this.records.get(tag);
    return record && record.created_at_unix === createdAtUnix ? record : undefined;
  }

  async record(tag: string, record: DigestRecord): Promise<void> {
    this.records.set(tag, record);
    await this.save();
  }

  /** Forgets records of tags not in `present` (snapshots deleted since). */
  async prune(present: ReadonlySet<string>): Promise<void> {
    let changed = false;
    for (const tag of this.records.keys()) {
      if (!present.has(tag)) {
        this.records.delete(tag);
        changed = true;
      }
    }
    if (changed) await this.save();
  }

  private save(): Promise<void> {
    const text = `${JSON.stringify(Object.fromEntries(this.records), null, 1)}\n`;
    this.writing = this.writing.then(async () => {
      await replaceFile(this.file, text);
    });
    return this.writing;
  }
}
