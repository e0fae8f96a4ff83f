/**
 * The daemon commands of the `forkd` CLI as separate processes against a daemon listening on a real Unix socket
 * and TCP: streaming exec (exact bytes, exit codes, stdin), tables and --json, kill, files, eval, and the one-line
 * errors. The daemon's services are the HTTP-level test double; test/api/e2e.test.ts covers real sandboxes.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import pino from "pino";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { ServicesDouble } from "./services-double.js";

const self = fileURLToPath(import.meta.url);
const CLI = path.join(path.dirname(self), "..", "..", "src", "cli", `main${path.extname(self)}`);
const TOKEN = "cli-test-token-0123456789";

interface Ran {
  code: number | null;
  stdout: Buffer;
  stderr: string;
}

function forkd(args: string[], options: { env?: Record<string, string>; stdin?: Buffer } = {}): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...process.execArgv, CLI, ...args], {
      env: { ...process.env, FORKD_URL: "", FORKD_TOKEN: "", ...options.env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    const out: Buffer[] = [];
    let err = "";
    child.stdout.on("data", (c: Buffer) => out.push(c));
    child.stderr.on("data", (c: Buffer) => {
      err += c.toString();
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout: Buffer.concat(out), stderr: err }));
    child.stdin.end(options.stdin);
  });
}

describe("forkd CLI against a daemon", { timeout: 180_000 }, () => {
  let dir: string;
  let daemon: RunningDaemon;
  let services: ServicesDouble;
  let url: string;
  let tcpUrl: string;
  let id: string;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-api-cli-"));
    const tokenFile = path.join(dir, "token");
    await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    services = new ServicesDouble();
    const socketPath = path.join(dir, "forkd.sock");
    daemon = await startDaemon(
      {
        socketPath,
        bind: "127.0.0.1:0",
        tokenFile,
        auditLog: null,
        snapshotsDir: "/srv/snapshots",
        logger: pino({ level: "silent" }),
      },
      services,
    );
    url = `unix:${socketPath}`;
    tcpUrl = daemon.urls[1] as string;
    const [sb] = await services.sandboxes.spawn({ snapshotTag: "py", n: 1 });
    id = (sb as { id: string }).id;
  });
  after(async () => {
    await daemon.stop("test");
    await rm(dir, { recursive: true, force: true });
  });

  it("exec streams exact bytes and exits with the command's exit code", async () => {
    const failed = await forkd(["exec", "--daemon-url", url, id, "--", "exit", "3"]);
    assert.equal(failed.code, 3, failed.stderr);
    assert.equal(failed.stderr, "bye\n");
    const bytes = await forkd(["exec", "--daemon-url", url, id, "--", "split-utf8"]);
    assert.equal(bytes.code, 0, bytes.stderr);
    assert.deepEqual([...bytes.stdout], [0xc3, 0xa9, 0x0a, 0xff]);
  });

  it("exec -i sends stdin (binary) and FORKD_URL/FORKD_TOKEN reach a TCP daemon", async () => {
    const input = Buffer.from([0, 1, 2, 0xfe, 0xff, 0x0a, ...Buffer.alloc(300_000, 7)]);
    const ran = await forkd(["exec", "-i", id, "--", "cat"], {
      env: { FORKD_URL: tcpUrl, FORKD_TOKEN: TOKEN },
      stdin: input,
    });
    assert.equal(ran.code, 0, ran.stderr);
    assert.ok(ran.stdout.equals(input), `stdout is stdin (${ran.stdout.length} of ${input.length} bytes)`);
    const wrong = await forkd(["ls"], { env: { FORKD_URL: tcpUrl, FORKD_TOKEN: `${TOKEN}-wrong` } });
    assert.equal(wrong.code, 1);
    assert.match(
      wrong.stderr,
      /^forkd: invalid bearer token \(daemon at http:\/\/127\.0\.0\.1:\d+: pass --daemon-token or set FORKD_TOKEN\)\n$/,
    );
  });

  it("spawn, ls (table and JSON), kill", async () => {
    const spawned = await forkd(["spawn", "--daemon-url", url, "--tag", "py", "-n", "2", "--json"]);
    assert.equal(spawned.code, 0, spawned.stderr);
    const ids = (JSON.parse(spawned.stdout.toString()) as { id: string }[]).map((s) => s.id);
    assert.equal(ids.length, 2);
    const table = await forkd(["ls", "--daemon-url", url]);
    assert.match(table.stdout.toString(), /^ID\s+SNAPSHOT\s+STATUS/);
    for (const sid of ids) assert.match(table.stdout.toString(), new RegExp(`^${sid}\\s+py\\s+running`, "m"));
    const killed = await forkd(["kill", "--daemon-url", url, ids[0] as string, "sb-ffffffffffff"]);
    assert.equal(killed.code, 1, "one id was unknown");
    assert.equal(killed.stdout.toString(), `${ids[0]}\n`);
    assert.match(killed.stderr, /sb-ffffffffffff: sandbox sb-ffffffffffff not found/);
    const listed = JSON.parse((await forkd(["ls", "--daemon-url", url, "--json"])).stdout.toString()) as {
      id: string;
    }[];
    assert.ok(!listed.some((s) => s.id === ids[0]));
    const usage = await forkd(["kill", "--daemon-url", url]);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /give sandbox ids, --tag <tag>, or --all/);
  });

  it("files put/get round-trip binary content; eval prints results and tracebacks", async () => {
    const local = path.join(dir, "blob.bin");
    const content = Buffer.from([0, 0xff, 0x0a, 0x0d, 1, 2, 3]);
    await writeFile(local, content);
    const put = await forkd(["files", "put", "--daemon-url", url, id, local, "/tmp/blob.bin"]);
    assert.equal(put.code, 0, put.stderr);
    const copy = path.join(dir, "copy.bin");
    const get = await forkd(["files", "get", "--daemon-url", url, id, "/tmp/blob.bin", copy]);
    assert.equal(get.code, 0, get.stderr);
    assert.deepEqual(await readFile(copy), content);
    const bad = await forkd(["files", "get", "--daemon-url", url, id, "/tmp/../etc/passwd"]);
    assert.equal(bad.code, 2, "invalid argument");
    assert.match(bad.stderr, /must not contain '\.' or '\.\.' segments/);
    const ok = await forkd(["eval", "--daemon-url", url, id, "40+2"]);
    assert.deepEqual([ok.code, ok.stdout.toString()], [0, "'40+2'\n"]);
    const raised = await forkd(["eval", "--daemon-url", url, id, "1/0"]);
    assert.equal(raised.code, 1);
    assert.match(raised.stderr, /^Traceback/);
  });

  it("says what to do when no daemon answers", async () => {
    const ran = await forkd(["ls", "--daemon-url", `unix:${path.join(dir, "absent.sock")}`]);
    assert.equal(ran.code, 1);
    assert.equal(
      ran.stderr,
      `forkd: cannot reach the forkd daemon at unix:${path.join(dir, "absent.sock")}: is \`forkd daemon\` running?\n`,
    );
    const badUrl = await forkd(["ls", "--daemon-url", "ftp://x"]);
    assert.equal(badUrl.code, 2);
    assert.match(badUrl.stderr, /invalid daemon URL/);
  });
});
