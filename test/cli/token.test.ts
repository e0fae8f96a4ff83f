/**
 * `forkd token new` through the real CLI binary: keys shaped like E2B's (`e2b_<hex>`, what every E2B SDK takes
 * as E2B_API_KEY), appended to a private token file the daemon's own loader then reads, tenants included.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { loadTokenFile } from "../../src/api/auth.js";
import { API_KEY_PATTERN, matchToken } from "../../src/common/tokens.js";
import { packageRoot } from "../../src/image/package-root.js";

const execFileAsync = promisify(execFile);
const FORKD_BIN = path.join(packageRoot(), "bin", "forkd.js");
const forkd = (...args: string[]) => execFileAsync(process.execPath, [FORKD_BIN, ...args]);

describe("forkd token new", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-token-"));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("prints a new E2B-shaped key each time", async () => {
    const [a, b] = await Promise.all([forkd("token", "new"), forkd("token", "new")]);
    for (const key of [a.stdout.trim(), b.stdout.trim()]) {
      assert.match(key, API_KEY_PATTERN);
      assert.equal(key.length, 44, "e2b_ and 40 hex digits");
    }
    assert.notEqual(a.stdout, b.stdout);
  });

  it("appends to a token file the daemon reads, creating it private; tenants as `tenant=`", async () => {
    const file = path.join(dir, "tokens");
    const admin = (await forkd("token", "new", "--append", file)).stdout.trim();
    const tenant = (await forkd("token", "new", "--append", file, "--tenant", "team-a")).stdout.trim();
    assert.equal((await stat(file)).mode & 0o777, 0o600);
    assert.equal(await readFile(file, "utf8"), `${admin}\n${tenant} tenant=team-a\n`);
    const tokens = await loadTokenFile(file);
    assert.equal(matchToken(admin, tokens)?.tenant, null);
    assert.equal(matchToken(tenant, tokens)?.tenant, "team-a");
  });

  it("refuses a token file others can read and a bad tenant name, writing nothing", async () => {
    const open = path.join(dir, "open-tokens");
    await writeFile(open, "");
    await chmod(open, 0o644);
    await assert.rejects(forkd("token", "new", "--append", open), /chmod 600/);
    assert.equal(await readFile(open, "utf8"), "");
    await assert.rejects(forkd("token", "new", "--tenant", "Team A"), /--tenant/);
  });
});
