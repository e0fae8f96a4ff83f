/**
 * scripts/check-node.sh (install-deps.sh's first step): a Node.js >= 20 with npm passes; an older one is
 * replaced from apt only when the configured sources offer >= 20 (Debian 13); on a plain Debian 12 it stops with
 * how to get one, installing nothing.
 *
 * This machine has one Node.js 20 and one apt configuration, so the other cases are made with fakes placed first
 * on PATH, named as such: FAKE node (reports v18), FAKE apt-cache (answers `policy nodejs` as Debian 12's or
 * Debian 13's archive does) and FAKE apt-get (records its arguments; "installing" nodejs puts the real node in
 * place of the fake). dpkg's version comparison and the script itself are real.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, it } from "node:test";
import { REPO_ROOT } from "../support/examples.js";

const SCRIPT = path.join(REPO_ROOT, "scripts", "check-node.sh");
const work = mkdtempSync(path.join(os.tmpdir(), "forkd-check-node-"));
const SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** `apt-cache policy nodejs` as Debian 12 (bookworm, bookworm-security) answers it, measured. */
const BOOKWORM_POLICY = `nodejs:
  Installed: (none)
  Candidate: 18.20.4+dfsg-1~deb12u3
  Version table:
     18.20.4+dfsg-1~deb12u3 500
     18.20.4+dfsg-1~deb12u2 500
`;
const TRIXIE_POLICY = `nodejs:
  Installed: (none)
  Candidate: 20.19.2+dfsg-1
  Version table:
     20.19.2+dfsg-1 500
`;

function fakes(name: string, policy: string): { bin: string; aptLog: string } {
  const bin = path.join(work, name);
  const aptLog = path.join(bin, "apt-get.log");
  spawnSync("mkdir", ["-p", bin]);
  const write = (file: string, text: string) => {
    writeFileSync(path.join(bin, file), text);
    chmodSync(path.join(bin, file), 0o755);
  };
  write("node", '#!/bin/sh\n# FAKE node: a Node.js 18\n[ "$1" = -p ] && echo 18 || echo v18.20.4\n');
  write("npm", "#!/bin/sh\n# FAKE npm\necho 9.2.0\n");
  write("apt-cache", `#!/bin/sh\n# FAKE apt-cache\ncat <<'EOF'\n${policy}EOF\n`);
  write(
    "apt-get",
    `#!/bin/sh\n# FAKE apt-get: records, and "installs" nodejs by putting the real node first on PATH\necho "$*" >> ${aptLog}\n` +
      `case "$*" in *nodejs*) ln -sf ${process.execPath} ${bin}/node ;; esac\n`,
  );
  return { bin, aptLog };
}

function check(bin: string | null) {
  const result = spawnSync("bash", [SCRIPT], {
    env: { PATH: bin === null ? SYSTEM_PATH : `${bin}:${SYSTEM_PATH}` },
    encoding: "utf8",
  });
  return { status: result.status, stderr: result.stderr };
}

describe("scripts/check-node.sh", () => {
  after(() => rmSync(work, { recursive: true, force: true }));

  it("passes with this machine's Node.js >= 20 and npm", () => {
    assert.deepEqual(check(null), { status: 0, stderr: "" });
  });

  it("stops on a plain Debian 12 (nodejs 18), installing nothing, saying how to get Node.js 20", () => {
    const { bin, aptLog } = fakes("bookworm", BOOKWORM_POLICY);
    const { status, stderr } = check(bin);
    assert.equal(status, 1);
    assert.match(stderr, /forkd needs Node\.js 20 or later, with npm; this machine has: v18\.20\.4\./);
    assert.match(stderr, /Debian 12's own nodejs is Node\.js 18/);
    assert.match(stderr, /NodeSource/);
    assert.equal(existsSync(aptLog), false, "apt-get was not run");
  });

  it("installs nodejs from apt when the configured sources offer >= 20", () => {
    const { bin, aptLog } = fakes("trixie", TRIXIE_POLICY);
    const { status, stderr } = check(bin);
    assert.deepEqual({ status, stderr }, { status: 0, stderr: "" });
    assert.match(readFileSync(aptLog, "utf8"), /^install -y -qq --no-install-recommends nodejs$/m);
  });
});
