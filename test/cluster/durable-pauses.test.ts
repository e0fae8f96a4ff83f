/**
 * A node's durable pauses (src/cluster-node/durable-pauses.ts) with real parts, without the whole cluster: two
 * daemon homes (real SandboxManagers, one minimal TCG sandbox), a real registry (Debian's docker-registry, deletes
 * enabled), the real API server with the chart's CRDs, and the controller's hand-over code between them.
 *
 * - the push refused: 507 when status.durablePauses is full (32), 503 naming the registry when it is down (the
 *   sandbox stays paused: the gateway's "paused, but not durably");
 * - the artifact deleted from the registry once unusable: resumed on its own node; adopted, then resumed on the
 *   adopter (the delete fails while the registry is down, and is done on the retry once it is back);
 * - node tokens rotated: the adopter, under a new token, unseals a record sealed under its previous one
 *   (--cluster-previous-token-file);
 * - an adoption whose record does not verify: refused once, logged, nothing inserted, reported done in
 *   status.adopted; the controller prunes it and hands nothing over again.
 */
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { after, before, describe, it } from "node:test";
import { CoreV1Api } from "@kubernetes/client-node";
import pino from "pino";
import { RecordError, unsealRecord } from "../../src/cluster/durable-record.js";
import type { DurablePause, ForkdNode } from "../../src/cluster/schemas.js";
import { CLUSTER_LIMITS } from "../../src/cluster/schemas.js";
import { HandOver } from "../../src/cluster-controller/hand-over.js";
import { ArtifactDeletes } from "../../src/cluster-node/artifact-deletes.js";
import { HeldDigests } from "../../src/cluster-node/digests.js";
import { artifactOf, DurablePauses, releasedHandOvers } from "../../src/cluster-node/durable-pauses.js";
import { previousCredentials } from "../../src/cluster-node/index.js";
import { ForkdError } from "../../src/common/errors.js";
import { ERROR_CODES } from "../../src/common/limits.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { skopeoDelete } from "../../src/image/index.js";
import { type ForkdObjects, forkdObjects } from "../../src/kube/objects.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { applyForkdCrds, type KubeTestCluster, startKubeCluster } from "../support/kube-cluster.js";
import { freePort, Registry } from "../support/registry.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const isRoot = process.geteuid?.() === 0;
const NAMESPACE = "durable";
/** The node token the pauses are sealed under; node-b runs with a rotated one and this one as the previous. */
const OLD_TOKEN = "old-node-token-for-the-durable-test";
const CREDENTIAL = tokenFromString(OLD_TOKEN).digest.toString("hex");
const ROTATED = tokenFromString("new-node-token-for-the-durable-test").digest.toString("hex");
type Services = Awaited<ReturnType<typeof openServices>>;
type Home = Awaited<ReturnType<typeof tempHome>>;

/** A logger whose lines the test reads. */
function capturedLogger() {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split("\n")) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  return { logger: pino({ level: "info" }, stream), lines };
}

async function until<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, ms = 60_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("a node's durable pauses", { skip: !isRoot && "needs root", timeout: 15 * 60_000 }, () => {
  let cluster: KubeTestCluster;
  let objects: ForkdObjects;
  let registry: Registry;
  let registryHost: string;
  let dir: string;
  const homes: Home[] = [];
  const opened: Services[] = [];
  let tag: string;

  /** A node: its home, services, durable pauses (with real registry deletes) and ForkdNode. */
  async function daemon(
    name: string,
    registryOf = () => registryHost,
    seal: { credential: string; previousFile?: string } = { credential: CREDENTIAL },
  ) {
    const home = await tempHome(`forkd-durable-${name}-`);
    homes.push(home);
    tag = await linkSharedSnapshot(home.home, "minimal");
    const services = await openServices(home);
    opened.push(services);
    const { logger, lines } = capturedLogger();
    const clusterDir = path.join(home.home, "cluster");
    const digests = await HeldDigests.open(clusterDir);
    const deletes = new ArtifactDeletes(
      path.join(clusterDir, "registry-deletes.json"),
      (reference) => skopeoDelete(`docker://${reference}`, { tlsVerify: false }),
      logger,
    );
    const durable = new DurablePauses(
      {
        registry: registryOf(),
        insecure: false,
        credential: seal.credential,
        previousCredentials: () => previousCredentials(seal.previousFile),
      },
      objects,
      digests,
      logger,
      path.join(clusterDir, "adopted.json"),
      deletes,
    );
    await objects.nodes.create(name, { url: "http://10.1.0.1:8889", epoch: 0, unschedulable: false });
    await objects.nodes.patchStatus(name, { observedEpoch: 0 });
    const paused = () => new Set(services.sandboxes.list({ status: "paused" }).map((s) => s.id));
    const node = async () => (await objects.nodes.get(name)) as ForkdNode;
    /** What the membership writes: the entries listed now, and the adoptions done. */
    const publish = async () => {
      const current = await node();
      await objects.nodes.patchStatus(name, {
        durablePauses: durable.listed(current, current.status?.observedEpoch ?? 0, paused()),
        adopted: durable.adoptedIds(current),
      });
    };
    return { name, home, services, durable, deletes, lines, paused, node, publish };
  }
  type Daemon = Awaited<ReturnType<typeof daemon>>;
  let a: Daemon;
  let b: Daemon;
  let id: string;
  let previousFile: string;

  const repository = (sandbox: string) => `forkd/paused/${sandbox}`;
  /** One round of the controller's hand-over, node-b the only live node. */
  const handOverRound = async () => {
    const nodes = (await objects.nodes.list()) as ForkdNode[];
    await new HandOver(objects, pino({ level: "silent" })).round(
      nodes.map((node) => ({ node, live: node.metadata.name === "node-b" })),
    );
  };

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-durable-registry-"));
    registry = new Registry(dir, await freePort());
    await registry.start();
    registryHost = `127.0.0.1:${registry.port}`;
    cluster = await startKubeCluster();
    await applyForkdCrds(cluster);
    objects = forkdObjects(cluster.admin, NAMESPACE);
    await cluster.admin.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name: NAMESPACE } } });
    // A fresh CRD's storage can answer 429 for a moment: the first write is retried until it is taken.
    await until(
      "the ForkdNode storage",
      async () => (await objects.nodes.list().catch(() => undefined)) && true,
    );
    a = await daemon("node-a");
    // node-b's token was rotated: the one node-a sealed under is its previous token.
    previousFile = path.join(dir, "node-token-previous");
    await writeFile(previousFile, `${OLD_TOKEN}\n`, { mode: 0o600 });
    b = await daemon("node-b", () => registryHost, { credential: ROTATED, previousFile });
    const [info] = await a.services.sandboxes.spawn({ snapshotTag: tag, n: 1, timeoutMs: 600_000 });
    id = (info as { id: string }).id;
    await a.services.sandboxes.files.write(id, "/root/durable.txt", Buffer.from("kept\n"));
    await a.services.sandboxes.pause(id);
  });
  after(async () => {
    for (const services of opened) await services.close({ killSandboxes: true });
    for (const home of homes) {
      assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
      await home.cleanup();
    }
    await registry?.stop();
    await cluster?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("refuses a push beyond 32 listed pauses (507) and one to a registry that is down (503; still paused)", async () => {
    const full = new DurablePauses(
      { registry: registryHost, insecure: false, credential: CREDENTIAL },
      objects,
      await HeldDigests.open(path.join(a.home.home, "cluster")),
      pino({ level: "silent" }),
      path.join(dir, "unused-adopted.json"),
      a.deletes,
    );
    const entries: DurablePause[] = Array.from({ length: CLUSTER_LIMITS.durablePausesPerNode }, (_, i) => ({
      id: `sb-${String(i).padStart(12, "0")}`,
      reference: `${registryHost}/forkd/paused/x:1`,
      digest: `sha256:${"c".repeat(64)}`,
      epoch: 0,
      pausedAt: new Date().toISOString(),
      record: "v1.x",
    }));
    full.restore({ status: { durablePauses: entries } } as ForkdNode);
    let published = 0;
    await assert.rejects(
      full.push(a.services, id, 0, async () => {
        published++;
      }),
      (err: unknown) =>
        err instanceof ForkdError &&
        err.code === "insufficient_storage" &&
        ERROR_CODES[err.code] === 507 &&
        /32 durable pauses/.test(err.message),
    );
    assert.equal(published, 0);

    const down = `127.0.0.1:${await freePort()}`;
    const nowhere = await daemon("node-down", () => down);
    await assert.rejects(
      nowhere.durable.push(a.services, id, 0, nowhere.publish),
      (err: unknown) =>
        err instanceof ForkdError &&
        err.code === "unavailable" &&
        ERROR_CODES[err.code] === 503 &&
        err.message.includes(`the registry ${down} is unavailable`),
    );
    assert.equal(a.services.sandboxes.get(id).status, "paused");
    assert.deepEqual(nowhere.durable.listed(undefined, 0, a.paused()), []);
  });

  it("deletes the artifact once its sandbox resumed on its node", async () => {
    const made = await a.durable.push(a.services, id, 0, a.publish);
    assert.equal(await registry.manifestStatus(repository(id), made.digest), 200);
    assert.deepEqual(
      ((await a.node()).status?.durablePauses ?? []).map((e) => e.id),
      [id],
    );
    await a.services.sandboxes.resume(id);
    await a.publish();
    assert.deepEqual((await a.node()).status?.durablePauses ?? [], []);
    await a.deletes.flush();
    assert.equal(await registry.manifestStatus(repository(id), made.digest), 404);
    assert.deepEqual(a.deletes.pending, []);
  });

  it("adopted on another node, resumed there: the artifact is deleted (retried while the registry is down)", async () => {
    await a.services.sandboxes.pause(id);
    const made = await a.durable.push(a.services, id, 0, a.publish);
    // node-a is lost and fenced; the controller hands its entry to node-b.
    await objects.nodes.patchSpec("node-a", { epoch: 1 });
    await handOverRound();
    const adopter = await b.node();
    assert.deepEqual(adopter.spec.adoptions, [{ id, fromNode: "node-a", fromEpoch: 0 }]);
    // Sealed under node-b's previous token: its own does not open it, the previous token file does.
    const entry = ((await a.node()).status?.durablePauses ?? [])[0] as DurablePause;
    assert.throws(() => unsealRecord(entry.record, id, entry.digest, ROTATED), RecordError);
    assert.deepEqual(await previousCredentials(path.join(dir, "absent")), []);
    assert.deepEqual(await previousCredentials(previousFile), [CREDENTIAL]);
    // node-a back now would keep its entry: node-b has not adopted it yet.
    const released = async () => {
      const nodes = (await objects.nodes.list()) as ForkdNode[];
      const fenced = nodes.find((n) => n.metadata.name === "node-a") as ForkdNode;
      return releasedHandOvers("node-a", fenced.spec.handedOver ?? [], nodes);
    };
    assert.deepEqual([...(await released())], []);
    b.durable.adoptListed(b.services, adopter);
    await until("the adoption", () => b.paused().has(id));
    assert.deepEqual(b.durable.adoptedIds(adopter), [id]);
    await b.publish();
    assert.deepEqual((await b.node()).status?.adopted, [id]);
    assert.deepEqual([...(await released())], [id], "adopted: node-a may drop its entry");
    const fencedA = await a.node();
    assert.deepEqual(
      a.durable.listed(fencedA, 1, new Set(), false, new Set()).map((e) => e.id),
      [id],
      "not released: kept",
    );
    assert.deepEqual(a.durable.listed(fencedA, 1, new Set(), false, await released()), []);
    // Reported done and marked handed over: the controller prunes the adoption.
    await handOverRound();
    assert.deepEqual((await b.node()).spec.adoptions, []);
    assert.equal(await registry.manifestStatus(repository(id), made.digest), 200, "kept while paused there");

    await registry.stop();
    await b.services.sandboxes.resume(id);
    assert.equal((await b.services.sandboxes.files.read(id, "/root/durable.txt")).data.toString(), "kept\n");
    await b.publish();
    await b.deletes.flush();
    assert.deepEqual(b.deletes.pending, [artifactOf(registryHost, id, made.digest)]);
    assert.ok(b.lines.some((l) => String(l.msg).startsWith("could not delete a durable pause's artifact")));
    await registry.start();
    assert.equal(await registry.manifestStatus(repository(id), made.digest), 200);
    await b.durable.retryDeletes();
    assert.equal(await registry.manifestStatus(repository(id), made.digest), 404);
    assert.deepEqual(b.deletes.pending, []);
  });

  it("refuses an adoption whose record does not verify, once: nothing inserted, reported done, pruned, not handed again", async () => {
    const entry = ((await a.node()).status?.durablePauses ?? [])[0] as DurablePause;
    assert.ok(entry, "node-a still lists its handed-over entry");
    const other = "sb-0000000000ff";
    const flipped =
      entry.record.slice(0, 20) + (entry.record[20] === "A" ? "B" : "A") + entry.record.slice(21);
    await objects.nodes.create("node-c", { url: "http://10.1.0.1:8889", epoch: 0, unschedulable: false });
    await objects.nodes.patchSpec("node-c", { epoch: 1 });
    await objects.nodes.patchStatus("node-c", {
      observedEpoch: 0,
      durablePauses: [{ ...entry, id: other, record: flipped }],
    });
    await handOverRound();
    const adopter = await b.node();
    assert.deepEqual(adopter.spec.adoptions, [{ id: other, fromNode: "node-c", fromEpoch: 0 }]);
    b.durable.adoptListed(b.services, adopter);
    await until("the refusal", () => b.durable.adoptedIds(adopter).includes(other));
    // Asked again (the node reads its spec every 2 s): not tried again.
    b.durable.adoptListed(b.services, adopter);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const refusals = b.lines.filter((l) => String(l.msg).startsWith("adoption refused"));
    assert.equal(refusals.length, 1);
    assert.match(String(refusals[0]?.err), /does not verify/);
    assert.equal(
      b.services.sandboxes.list().some((s) => s.id === other),
      false,
    );
    await b.publish();
    for (let round = 0; round < 3; round++) {
      await handOverRound();
    }
    const nodes = (await objects.nodes.list()) as ForkdNode[];
    assert.deepEqual(
      nodes.flatMap((n) => n.spec.adoptions ?? []),
      [],
    );
    const c = nodes.find((n) => n.metadata.name === "node-c") as ForkdNode;
    assert.deepEqual(c.spec.handedOver, [{ id: other, toNode: "node-b" }]);
  });
});
