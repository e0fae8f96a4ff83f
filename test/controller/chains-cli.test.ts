/**
 * The chain commands of the `forkd` CLI as processes, without VMs, on a synthetic chain t0 -> t1 -> t2
 * (chains-synthetic.ts): snapshot-info, rmi (dependents, --cascade, --force), snapshot-compact and pack/unpack,
 * both on the local engine and through a daemon (real snapshot service, real Unix socket). Compaction is also
 * checked byte for byte here: the flat memory image is the chain's RAM, and `qemu-img compare` finds the flat
 * disk layer identical to the chain's.
 */
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pino from "pino";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { readLayerIndex } from "../../src/store/memory-layer.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { tempHome } from "../support/host.js";
import { SYNTHETIC_RAM, syntheticChain } from "./chains-synthetic.js";

const run = promisify(execFile);
const self = fileURLToPath(import.meta.url);
const CLI = path.join(path.dirname(self), "..", "..", "src", "cli", `main${path.extname(self)}`);

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

function forkd(args: string[], env: Record<string, string>): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...process.execArgv, CLI, ...args], {
      env: { ...process.env, FORKD_URL: "", FORKD_TOKEN: "", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c: Buffer) => {
      stdout += c.toString();
    });
    child.stderr.on("data", (c: Buffer) => {
      stderr += c.toString();
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

type Home = Awaited<ReturnType<typeof tempHome>>;

describe("chain commands of the forkd CLI (no VM)", { timeout: 5 * 60_000 }, () => {
  let home: Home;
  let env: Record<string, string>;

  before(async () => {
    home = await tempHome("forkd-chains-cli-");
    await syntheticChain(home, 2);
    env = { FORKD_HOME: home.home };
  });
  after(async () => {
    await home.cleanup();
  });

  it("snapshot-info: table and --json", async () => {
    const json = await forkd(["snapshot-info", "t2", "--local", "--json"], env);
    assert.equal(json.code, 0, json.stderr);
    const detail = JSON.parse(json.stdout) as {
      chain_depth: number;
      ancestors: string[];
      layers: { tag: string; memory: { format: string; pages: number; physical_bytes: number } }[];
    };
    assert.deepEqual([detail.chain_depth, detail.ancestors], [2, ["t0", "t1"]]);
    assert.deepEqual(
      detail.layers.map((l) => [l.tag, l.memory.format, l.memory.pages]),
      [
        ["t0", "flat", 16384],
        ["t1", "layer", 3],
        ["t2", "layer", 3],
      ],
    );
    const table = await forkd(["snapshot-info", "t0", "--local"], env);
    assert.equal(table.code, 0, table.stderr);
    assert.match(table.stdout, /chain +depth 0: t0\n/);
    assert.match(table.stdout, /dependents t1 \(all: t1, t2\)\n/);
    assert.match(table.stdout, /^t0 +template +flat +64\.0 MiB/m);
    const missing = await forkd(["snapshot-info", "nope", "--local"], env);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /snapshot "nope" not found/);
  });

  it("snapshot-compact writes the chain's exact RAM and disk into one flat snapshot", async () => {
    const ran = await forkd(["snapshot-compact", "--from", "t2", "--to", "flat", "--local", "--json"], env);
    assert.equal(ran.code, 0, ran.stderr);
    assert.equal((JSON.parse(ran.stdout) as { parent_tag: unknown }).parent_tag, null);
    const store = new SnapshotStore(home.snapshots);
    const flat = await store.get("flat");
    assert.deepEqual([flat.manifest.parent, flat.manifest.origin.kind], [null, "compact"]);
    // RAM: t0's image with t1's then t2's pages applied.
    const expected = Buffer.alloc(SYNTHETIC_RAM);
    (await readFile(path.join(store.dirOf("t0"), "memory.bin"))).copy(expected);
    for (const tag of ["t1", "t2"]) {
      const file = path.join(store.dirOf(tag), "memory.layer");
      const { pages, dataOffset } = await readLayerIndex(file);
      const bytes = await readFile(file);
      pages.forEach((page, i) => {
        bytes.copy(expected, page * 4096, dataOffset + i * 4096, dataOffset + (i + 1) * 4096);
      });
    }
    assert.ok(
      (await readFile(path.join(flat.dir, "memory.bin"))).equals(expected),
      "memory.bin is the chain's RAM",
    );
    // Disk: the guest sees the same bytes through the one flat layer as through the chain.
    const compared = await run("qemu-img", [
      "compare",
      "-f",
      "qcow2",
      "-F",
      "qcow2",
      path.join(store.dirOf("t2"), "disk.qcow2"),
      path.join(flat.dir, "disk.qcow2"),
    ]);
    assert.match(compared.stdout, /Images are identical/);
    const clash = await forkd(["snapshot-compact", "--from", "t2", "--to", "flat", "--local"], env);
    assert.equal(clash.code, 1);
    assert.match(clash.stderr, /"flat" already exists/);
  });

  it("pack and unpack as commands: another home, --tag", async () => {
    const out = path.join(home.home, "t2.tar.zst");
    const packed = await forkd(["pack", "-t", "t2", "-o", out, "--without-image", "--json"], env);
    assert.equal(packed.code, 0, packed.stderr);
    assert.deepEqual((JSON.parse(packed.stdout) as { chain: string[] }).chain, ["t0", "t1", "t2"]);
    const again = await forkd(["pack", "-t", "t2", "-o", out, "--without-image"], env);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /already exists/);
    const other = await tempHome("forkd-chains-cli-b-");
    try {
      const unpacked = await forkd(["unpack", out, "--tag", "copy", "--json"], { FORKD_HOME: other.home });
      assert.equal(unpacked.code, 0, unpacked.stderr);
      const result = JSON.parse(unpacked.stdout) as { head: string; installed: string[] };
      assert.deepEqual([result.head, result.installed], ["copy", ["t0", "t1", "copy"]]);
      const info = await forkd(["snapshot-info", "copy", "--local", "--json"], { FORKD_HOME: other.home });
      assert.deepEqual((JSON.parse(info.stdout) as { ancestors: string[] }).ancestors, ["t0", "t1"]);
    } finally {
      await other.cleanup();
    }
  });

  it("rmi through a daemon: dependents named, --force orphans, --cascade takes the subtree", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-chains-cli-sock-"));
    const services = await openServices(home);
    let daemon: RunningDaemon | undefined;
    try {
      daemon = await startDaemon(
        {
          socketPath: path.join(dir, "forkd.sock"),
          auditLog: null,
          snapshotsDir: home.snapshots,
          logger: pino({ level: "silent" }),
        },
        services,
      );
      const viaDaemon = { ...env, FORKD_URL: daemon.urls[0] as string };
      const refused = await forkd(["rmi", "t1"], viaDaemon);
      assert.equal(refused.code, 1);
      assert.match(refused.stderr, /snapshot "t1" has dependents: t2 \(delete them first, or use --cascade/);
      const info = await forkd(["snapshot-info", "t2", "--json"], viaDaemon);
      assert.equal(info.code, 0, info.stderr);
      assert.deepEqual((JSON.parse(info.stdout) as { ancestors: string[] }).ancestors, ["t0", "t1"]);

      const forced = await forkd(["rmi", "t1", "--force"], viaDaemon);
      assert.equal(forced.code, 0, forced.stderr);
      assert.equal(forced.stdout, "deleted t1\norphaned (unbootable until deleted): t2\n");
      const orphan = await forkd(["snapshot-info", "t2", "--json"], viaDaemon);
      assert.match(
        (JSON.parse(orphan.stdout) as { chain_error: string }).chain_error,
        /layer t2 depends on t1, which is missing/,
      );
      const compacted = await forkd(
        ["snapshot-compact", "--from", "flat", "--to", "flat2", "--json"],
        viaDaemon,
      );
      assert.equal(compacted.code, 0, compacted.stderr);
      assert.equal((JSON.parse(compacted.stdout) as { tag: string }).tag, "flat2");
    } finally {
      await daemon?.stop("test");
      await rm(dir, { recursive: true, force: true });
    }
    // Locally: t0 has no dependents left (t2 hangs on the missing t1), so --cascade takes t0 alone.
    const cascade = await forkd(["rmi", "t0", "--cascade", "--local", "--json"], env);
    assert.equal(cascade.code, 0, cascade.stderr);
    assert.deepEqual(JSON.parse(cascade.stdout), { deleted: ["t0"], orphaned: [] });
    const rest = await forkd(["snapshots", "--local", "--json"], env);
    assert.deepEqual(
      (JSON.parse(rest.stdout) as { tag: string }[]).map((s) => s.tag),
      ["flat", "flat2", "t2"],
    );
  });
});
