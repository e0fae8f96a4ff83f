/** Private directories in shared places: created 0700, a foreign or loose one refused, names not guessable. */
import assert from "node:assert/strict";
import { chmod, chown, mkdir, mkdtemp, rm, stat, symlink } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, describe, it } from "node:test";
import { ensurePrivateDir, unguessableDirName } from "../../src/common/private-dir.js";

describe("private directories", () => {
  const roots: string[] = [];
  after(async () => {
    for (const dir of roots) await rm(dir, { recursive: true, force: true });
  });
  const root = async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-private-"));
    roots.push(dir);
    return dir;
  };

  it("creates a 0700 directory and accepts one that is already ours", async () => {
    const dir = path.join(await root(), "images");
    await ensurePrivateDir(dir);
    assert.equal((await stat(dir)).mode & 0o777, 0o700);
    await ensurePrivateDir(dir);
  });

  it("refuses a directory another user created, one with group/other bits, and a symbolic link", async () => {
    const base = await root();
    const foreign = path.join(base, "foreign");
    await mkdir(foreign, { mode: 0o700 });
    await chown(foreign, 65534, 65534);
    await assert.rejects(ensurePrivateDir(foreign), /owned by uid 65534 .*someone else created it/);
    const loose = path.join(base, "loose");
    await mkdir(loose);
    await chmod(loose, 0o755);
    await assert.rejects(ensurePrivateDir(loose), /mode 755, not a private directory/);
    const target = path.join(base, "target");
    await mkdir(target, { mode: 0o700 });
    const link = path.join(base, "link");
    await symlink(target, link);
    await assert.rejects(ensurePrivateDir(link), /not a directory of ours \((ELOOP|ENOTDIR)\)/);
  });

  it("names a shared-place directory at random once, and keeps the name", async () => {
    const home = await root();
    const record = path.join(home, "cache", "tmpfs-dir");
    const first = unguessableDirName("/dev/shm", "forkd-x-", record);
    assert.match(path.basename(first), /^forkd-x-[0-9a-f]{24}$/);
    assert.equal(unguessableDirName("/dev/shm", "forkd-x-", record), first, "remembered");
    assert.equal((await stat(record)).mode & 0o777, 0o600);
    const other = unguessableDirName("/dev/shm", "forkd-x-", path.join(await root(), "cache", "tmpfs-dir"));
    assert.notEqual(other, first, "another home, another name");
  });
});
