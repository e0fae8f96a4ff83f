/**
 * Integrity without a per-spawn tax. Snapshot files are hashed when written (or imported); afterwards a file is
 * re-hashed only when its identity (inode, size, mtime, ctime) changed, or once per host boot. Every write to a
 * file changes its mtime/ctime, so a flipped byte is caught before a child runs on it, at the cost of a stat.
 * Records persist in `<cacheDir>/verified.json`, shared by the daemon and CLI processes.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readFile, rename, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { digestFile } from "./hash.js";

interface Identity {
  ino: number;
  size: number;
  mtimeNs: string;
  ctimeNs: string;
}

interface VerifiedRecord extends Identity {
  sha256: string;
  bootId: string;
}

let bootIdCache: string | undefined;
async function bootId(): Promise<string> {
  bootIdCache ??= (await readFile("/proc/sys/kernel/random/boot_id", "utf8")).trim();
  return bootIdCache;
}

async function identityOf(file: string): Promise<Identity> {
  const st = await stat(file, { bigint: true });
  return {
    ino: Number(st.ino),
    size: Number(st.size),
    mtimeNs: String(st.mtimeNs),
    ctimeNs: String(st.ctimeNs),
  };
}

export class FileVerifier {
  private records: Map<string, VerifiedRecord> | undefined;
  private readonly file: string;

  constructor(cacheDir: string) {
    this.file = path.join(cacheDir, "verified.json");
  }

  /**
   * Resolves when `file` has content `sha256`; throws `unprocessable` naming `what` if it does not. Costs a stat
   * when the file is unchanged since it was last verified during this host boot.
   */
  async verify(file: string, sha256: string, what: string): Promise<"cached" | "hashed"> {
    const records = await this.load();
    const identity = await identityOf(file).catch(() => {
      throw new ForkdError("conflict", `${what}: ${file} is missing`);
    });
    const known = records.get(file);
    const boot = await bootId();
    if (
      known &&
      known.sha256 === sha256 &&
      known.bootId === boot &&
      known.ino === identity.ino &&
      known.size === identity.size &&
      known.mtimeNs === identity.mtimeNs &&
      known.ctimeNs === identity.ctimeNs
    ) {
      return "cached";
    }
    const actual = await digestFile(file);
    if (actual.sha256 !== sha256) {
      records.delete(file);
      await this.save();
      throw new ForkdError(
        "unprocessable",
        `${what}: ${path.basename(file)} is corrupted (sha256 mismatch); delete or re-import it`,
      );
    }
    records.set(file, { ...identity, sha256, bootId: boot });
    await this.save();
    return "hashed";
  }

  /**
   * The sha256 recorded for `file` if it is unchanged since it was recorded during this host boot, else
   * undefined. For files without a manifest entry to verify against (a pack's copy of an image's rootfs).
   */
  async known(file: string): Promise<string | undefined> {
    const known = (await this.load()).get(file);
    if (!known || known.bootId !== (await bootId())) return undefined;
    const identity = await identityOf(file).catch(() => undefined);
    if (
      !identity ||
      known.ino !== identity.ino ||
      known.size !== identity.size ||
      known.mtimeNs !== identity.mtimeNs ||
      known.ctimeNs !== identity.ctimeNs
    ) {
      return undefined;
    }
    return known.sha256;
  }

  /** Records a file just written with a known hash, so its first use does not hash it again. */
  async remember(file: string, sha256: string): Promise<void> {
    await this.rememberAll([{ file, sha256 }]);
  }

  /** `remember` for several files, saved once. */
  async rememberAll(files: readonly { file: string; sha256: string }[]): Promise<void> {
    const records = await this.load();
    const boot = await bootId();
    for (const { file, sha256 } of files)
      records.set(file, { ...(await identityOf(file)), sha256, bootId: boot });
    await this.save();
  }

  private async load(): Promise<Map<string, VerifiedRecord>> {
    if (this.records) return this.records;
    try {
      const parsed = JSON.parse(await readFile(this.file, "utf8")) as Record<string, VerifiedRecord>;
      this.records = new Map(Object.entries(parsed));
    } catch {
      this.records = new Map();
    }
    return this.records;
  }

  private async save(): Promise<void> {
    if (!this.records) return;
    await mkdir(path.dirname(this.file), { recursive: true, mode: 0o700 });
    // Unique per write: concurrent spawns in one daemon each save, and a shared temp name made one rename fail.
    const tmp = `${this.file}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`;
    await writeFile(tmp, JSON.stringify(Object.fromEntries(this.records)), { mode: 0o600 });
    await rename(tmp, this.file);
  }
}
