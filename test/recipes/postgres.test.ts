/**
 * The postgres recipe on real VMs: initdb ran at build time, the postmaster was started by `start` and found
 * ready by `ready` (pg_isready) in the parent, so every child accepts a connection and a query right after it
 * is spawned, and each child's database is its own.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { runExample } from "../support/examples.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const isRoot = process.geteuid?.() === 0;

describe("recipe postgres", { skip: !isRoot && "needs root", timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-postgres-");
    await createSnapshot(home, { tag: "postgres", template: "postgres" });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("children accept a connection and a query right after spawn, each with its own database", async (t) => {
    const services = await openServices(home);
    try {
      const children = await services.sandboxes.spawn({ snapshotTag: "postgres", n: 3, timeoutMs: 0 });
      const ids = children.map((c) => (c as { id: string }).id);
      // The very first command in each child: no retry, no waiting for the server.
      const first = await Promise.all(
        ids.map(async (id) => {
          const started = performance.now();
          const r = await services.sandboxes.exec(id, [
            "psql",
            "-Atc",
            "select 6 * 7, current_setting('server_version')",
          ]);
          return { r, ms: performance.now() - started };
        }),
      );
      for (const { r, ms } of first) {
        assert.equal(r.exitCode, 0, r.stderr.toString());
        assert.match(r.stdout.toString(), /^42\|15\./);
        t.diagnostic(`first query answered ${ms.toFixed(0)} ms after the child was ready`);
      }
      // Each child writes its own rows; none sees another's.
      await Promise.all(
        ids.map((id, i) =>
          services.sandboxes.exec(id, [
            "psql",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            `create table notes(n int); insert into notes select generate_series(1, ${i + 1});`,
          ]),
        ),
      );
      for (const [i, id] of ids.entries()) {
        const r = await services.sandboxes.exec(id, ["psql", "-Atc", "select count(*) from notes"]);
        assert.equal(r.stdout.toString().trim(), String(i + 1), `child ${i} sees only its own rows`);
      }
      // No procps in the image: the processes' command lines from /proc.
      const ps = await services.sandboxes.exec(ids[0] as string, [
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
      ]);
      assert.match(
        ps.stdout.toString(),
        /postgres -D \/var\/lib\/postgresql\/data/,
        "the parent's postmaster",
      );
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("examples/postgres/test-per-child.ts runs its test in every child, through the SDK and a real API", async () => {
    const services = await openServices(home);
    try {
      const { stdout } = await runExample(services, home, {
        file: "postgres/test-per-child.ts",
        snapshotTag: "postgres",
        args: ["3"],
      });
      assert.match(stdout, /^3 children spawned in \d+ ms$/m, stdout);
      // console.table: one row per child with its own expected sum, every one ok.
      for (const sum of [5050, 10100, 15150])
        assert.match(stdout, new RegExp(`\\b${sum}\\b.*\\btrue\\b`), stdout);
      assert.doesNotMatch(stdout, /\bfalse\b/, stdout);
      assert.deepEqual(services.sandboxes.list(), [], "the example killed its children");
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
});
