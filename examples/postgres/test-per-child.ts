/**
 * A database test per child: fork N sandboxes from the `postgres` recipe's snapshot (PostgreSQL already
 * initialised and running in each), run the same schema-and-data test in all of them at once, each with its
 * own input, and show that every child got a ready database at once and kept its data to itself.
 *
 *   forkd snapshot --tag postgres --template postgres     # once
 *   forkd daemon &                                       # the SDK talks to the daemon
 *   node --import tsx examples/postgres/test-per-child.ts [n]
 *
 * Settings as in examples/sdk/quickstart.ts (FORKD_URL, FORKD_TOKEN); FORKD_SNAPSHOT overrides the tag.
 */
import { Sandbox } from "../../src/sdk/index.js";

const n = Number(process.argv[2] ?? 4);
const snapshotTag = process.env.FORKD_SNAPSHOT ?? "postgres";

/** The test each child runs: its own table, rows that depend on its index, a query over them. */
const testFor = (i: number) => `
set -e
psql -v ON_ERROR_STOP=1 -q <<'SQL'
create table orders (id serial primary key, customer text not null, amount numeric not null);
insert into orders (customer, amount) select 'customer-' || g, g * ${i + 1} from generate_series(1, 100) g;
SQL
psql -At -c "select count(*), sum(amount) from orders"
`;

const started = performance.now();
const sandboxes = await Sandbox.createMany(n, { snapshotTag, timeoutMs: 120_000 });
const spawnedMs = performance.now() - started;
try {
  const rows = await Promise.all(
    sandboxes.map(async (sandbox, i) => {
      const t0 = performance.now();
      // The first thing each child does: connect. No retry, no waiting for the server.
      const ping = await sandbox.commands.run("psql -At -c 'select 1'");
      const firstQueryMs = Math.round(performance.now() - t0);
      const result = await sandbox.commands.run(testFor(i));
      const [count, sum] = result.stdout.trim().split("|");
      return {
        id: sandbox.id,
        first_query_ms: firstQueryMs,
        ping: ping.stdout.trim(),
        rows: Number(count),
        sum: Number(sum),
        expected_sum: 5050 * (i + 1),
        ok: Number(count) === 100 && Number(sum) === 5050 * (i + 1),
      };
    }),
  );
  console.log(`${n} children spawned in ${Math.round(spawnedMs)} ms`);
  console.table(rows);
  if (!rows.every((r) => r.ok)) process.exitCode = 1;
} finally {
  await Promise.allSettled(sandboxes.map((sandbox) => sandbox.kill()));
}
