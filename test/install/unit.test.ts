/**
 * packaging/forkd.service passes `systemd-analyze verify` (syntax, directives, the commands it runs). The unit
 * runs /usr/bin/forkd, which only the Debian package installs: the check runs in a mount namespace of its own
 * where /usr/bin has a `forkd` overlaid (the checkout's bin/forkd.js), so the host is not touched. The install
 * test (install.install-test.ts) verifies the unit again as the package installs it, in the package's root.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, it } from "node:test";
import { REPO_ROOT } from "../support/examples.js";
import { sealedHost } from "./sealed.js";

const UNIT = path.join(REPO_ROOT, "packaging", "forkd.service");
const FORKD_JS = path.join(REPO_ROOT, "bin", "forkd.js");
const work = mkdtempSync(path.join(os.tmpdir(), "forkd-unit-"));

/** `systemd-analyze verify <unit>` where /usr/bin/forkd exists (an overlay on /usr/bin, in a mount namespace). */
async function verify(unit: string): Promise<{ status: number | null; output: string }> {
  const box = await sealedHost({ checkouts: true });
  try {
    const overlay = await box.run([
      "sh",
      "-c",
      [
        "set -e",
        "mount -t tmpfs tmpfs /mnt",
        "mkdir /mnt/upper /mnt/work",
        'ln -s "$1" /mnt/upper/forkd',
        "mount -t overlay overlay -o lowerdir=/usr/bin,upperdir=/mnt/upper,workdir=/mnt/work /usr/bin",
      ].join("\n"),
      "sh",
      FORKD_JS,
    ]);
    assert.equal(overlay.status, 0, overlay.stderr);
    const result = await box.run(["systemd-analyze", "verify", unit]);
    return { status: result.status, output: `${result.stdout}${result.stderr}`.trim() };
  } finally {
    await box.close();
  }
}

describe("the systemd unit", { skip: process.getuid?.() !== 0 && "needs root (a mount namespace)" }, () => {
  after(() => rmSync(work, { recursive: true, force: true }));

  it("passes systemd-analyze verify with nothing to report", async () => {
    const which = spawnSync("sh", ["-c", "command -v systemd-analyze"], { encoding: "utf8" });
    assert.equal(
      which.status,
      0,
      "systemd-analyze is missing: apt-get install systemd (scripts/install-deps.sh)",
    );
    assert.deepEqual(await verify(UNIT), { status: 0, output: "" });
  });

  it("is checked for real: a misspelt directive and a missing command are reported", async () => {
    const broken = path.join(work, "forkd.service");
    const text = readFileSync(UNIT, "utf8");
    writeFileSync(broken, text.replace("KillMode=process", "KilMode=process"));
    // systemd-analyze exits 0 on an unknown key: the first test's "no output" is what catches it.
    assert.match((await verify(broken)).output, /Unknown key 'KilMode' in section \[Service\]/);
    writeFileSync(broken, text.replace("ExecStart=/usr/bin/forkd", "ExecStart=/usr/bin/forkd-nonexistent"));
    const missing = await verify(broken);
    assert.notEqual(missing.status, 0);
    assert.match(missing.output, /forkd-nonexistent is not executable/);
  });
});
