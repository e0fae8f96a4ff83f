/**
 * forkd's CRDs, as the chart ships them (deploy/helm/forkd/crds/), on the real API server: they become
 * Established; good objects are accepted with their defaults; the OpenAPI schemas and CEL rules refuse bad
 * ones with their messages; status and scale are subresources; `kubectl get` prints the declared columns.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { ApiException, CoreV1Api, CustomObjectsApi } from "@kubernetes/client-node";
import {
  FORKD_API,
  FORKD_API_GROUP,
  FORKD_API_VERSION,
  FORKD_KINDS,
  FORKD_NODE,
  FORKD_SNAPSHOT,
  FORKD_WARM_POOL,
  type KindNames,
} from "../../src/cluster/api-group.js";
import type { ForkdNode, ForkdSnapshot, ForkdWarmPool } from "../../src/cluster/schemas.js";
import { applyForkdCrds, type KubeTestCluster, startKubeCluster } from "../support/kube-cluster.js";

const NAMESPACE = "crds";
const DIGEST = `sha256:${"a".repeat(64)}`;
const OTHER_DIGEST = `sha256:${"b".repeat(64)}`;

type Body = Record<string, unknown>;

describe("forkd CRDs on the API server", () => {
  let cluster: KubeTestCluster;
  let objects: CustomObjectsApi;
  const at = (names: KindNames) => ({
    group: FORKD_API_GROUP,
    version: FORKD_API_VERSION,
    namespace: NAMESPACE,
    plural: names.plural,
  });
  const create = (names: KindNames, body: Body) =>
    objects.createNamespacedCustomObject({ ...at(names), body, fieldValidation: "Strict" });
  const get = <T>(names: KindNames, name: string) =>
    objects.getNamespacedCustomObject({ ...at(names), name }) as Promise<T>;
  /** The API server's message for a refused write (the call must fail with 422 or 400). */
  async function refusal(call: Promise<unknown>): Promise<string> {
    try {
      await call;
    } catch (err) {
      if (!(err instanceof ApiException)) throw err;
      assert.ok([400, 422].includes(err.code), `refused as invalid, got ${err.code}: ${err.body}`);
      return String(JSON.parse(String(err.body)).message);
    }
    assert.fail("the API server accepted it");
  }

  const node = (name: string, spec: Body = {}): Body => ({
    apiVersion: FORKD_API,
    kind: FORKD_NODE.kind,
    metadata: { name },
    spec: { url: `http://10.1.0.1:8889`, ...spec },
  });
  const snapshot = (name: string, spec: Body = {}): Body => ({
    apiVersion: FORKD_API,
    kind: FORKD_SNAPSHOT.kind,
    metadata: { name },
    spec: { reference: "registry.example:5000/forkd/pyagent:v1", digest: DIGEST, ...spec },
  });
  const pool = (name: string, spec: Body = {}): Body => ({
    apiVersion: FORKD_API,
    kind: FORKD_WARM_POOL.kind,
    metadata: { name },
    spec: { snapshot: "pyagent", ...spec },
  });

  before(async () => {
    cluster = await startKubeCluster();
    objects = cluster.admin.makeApiClient(CustomObjectsApi);
    await cluster.admin.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name: NAMESPACE } } });
    // As users apply them (kubectl): the typed client would send them through its model classes, which
    // know `default` and `x-kubernetes-validations` by other names and drop them.
    await applyForkdCrds(cluster);
  });
  after(async () => {
    await cluster?.stop();
  });

  it("accepts good objects and fills in the defaults", async () => {
    await create(FORKD_NODE, node("node-a"));
    await create(FORKD_SNAPSHOT, snapshot("pyagent", { aliases: ["code-interpreter-v1", "base"] }));
    await create(FORKD_WARM_POOL, pool("pyagent", { replicas: 4, spread: { maxPerNode: 2, minNodes: 2 } }));
    assert.deepEqual((await get<ForkdNode>(FORKD_NODE, "node-a")).spec, {
      url: "http://10.1.0.1:8889",
      epoch: 0,
      unschedulable: false,
    });
    assert.equal((await get<ForkdSnapshot>(FORKD_SNAPSHOT, "pyagent")).spec.prepull, 0);
    assert.equal((await get<ForkdWarmPool>(FORKD_WARM_POOL, "pyagent")).spec.replicas, 4);
  });

  it("refuses fields the schema does not declare and values outside it", async () => {
    assert.match(
      await refusal(create(FORKD_NODE, node("node-x", { capacity: 3 }))),
      /unknown field "spec.capacity"/,
    );
    assert.match(await refusal(create(FORKD_NODE, node("node-x", { url: "ftp://x" }))), /spec.url/);
    assert.match(await refusal(create(FORKD_NODE, node("node-x", { epoch: -1 }))), /spec.epoch/);
    assert.match(
      await refusal(create(FORKD_SNAPSHOT, snapshot("s1", { digest: "sha256:abc" }))),
      /spec.digest/,
    );
    assert.match(
      await refusal(create(FORKD_SNAPSHOT, snapshot("s1", { reference: "-rm/x" }))),
      /spec.reference/,
    );
    assert.match(
      await refusal(create(FORKD_SNAPSHOT, snapshot("s1", { aliases: ["a/b"] }))),
      /spec.aliases\[0\]/,
    );
    assert.match(
      await refusal(create(FORKD_SNAPSHOT, snapshot("s1", { aliases: ["a", "a"] }))),
      /Duplicate value/,
    );
    assert.match(await refusal(create(FORKD_WARM_POOL, pool("p1", { replicas: 100_001 }))), /spec.replicas/);
    assert.match(
      await refusal(create(FORKD_WARM_POOL, pool("p1", { snapshot: "Not_A_Name" }))),
      /spec.snapshot/,
    );
  });

  it("checks the CEL rules, on create and on change", async () => {
    assert.match(
      await refusal(
        create(FORKD_SNAPSHOT, snapshot("s2", { reference: `registry.example/forkd/x@${OTHER_DIGEST}` })),
      ),
      /a reference with a digest must name spec.digest/,
    );
    await create(FORKD_SNAPSHOT, snapshot("s2", { reference: `registry.example/forkd/x@${DIGEST}` }));
    assert.match(
      await refusal(create(FORKD_WARM_POOL, pool("p2", { replicas: 1, spread: { minNodes: 2 } }))),
      /spread.minNodes cannot exceed replicas/,
    );

    const current = await get<ForkdNode>(FORKD_NODE, "node-a");
    const raised = await objects.replaceNamespacedCustomObject({
      ...at(FORKD_NODE),
      name: "node-a",
      body: { ...current, spec: { ...current.spec, epoch: 3 } },
    });
    const lowered = { ...(raised as ForkdNode), spec: { ...current.spec, epoch: 2 } };
    assert.match(
      await refusal(
        objects.replaceNamespacedCustomObject({ ...at(FORKD_NODE), name: "node-a", body: lowered }),
      ),
      /spec.epoch may only be raised/,
    );

    const poolNow = await get<ForkdWarmPool>(FORKD_WARM_POOL, "pyagent");
    assert.match(
      await refusal(
        objects.replaceNamespacedCustomObject({
          ...at(FORKD_WARM_POOL),
          name: "pyagent",
          body: { ...poolNow, spec: { ...poolNow.spec, snapshot: "other" } },
        }),
      ),
      /spec.snapshot is immutable/,
    );
  });

  it("keeps status a subresource: the main resource ignores it, /status checks it against spec", async () => {
    const before = await get<ForkdNode>(FORKD_NODE, "node-a");
    const status = {
      version: "0.1.0",
      observedEpoch: before.spec.epoch,
      capacity: { sandboxes: 100, memoryMiB: 65536, vcpus: 32, diskMiB: 500_000 },
      sandboxes: 7,
      snapshots: [{ digest: DIGEST, reference: "registry.example:5000/forkd/pyagent:v1" }],
      pools: [{ digest: DIGEST, ready: 2, target: 2 }],
      conditions: [
        {
          type: "Ready",
          status: "True",
          reason: "Serving",
          message: "",
          lastTransitionTime: "2026-12-01T00:00:00Z",
        },
      ],
    };
    const viaMain = (await objects.replaceNamespacedCustomObject({
      ...at(FORKD_NODE),
      name: "node-a",
      body: { ...before, status },
    })) as ForkdNode;
    assert.equal(viaMain.status, undefined, "status written through the main resource is dropped");

    const written = (await objects.replaceNamespacedCustomObjectStatus({
      ...at(FORKD_NODE),
      name: "node-a",
      body: { ...viaMain, spec: { ...viaMain.spec, unschedulable: true }, status },
    })) as ForkdNode;
    assert.equal(written.status?.sandboxes, 7);
    assert.equal(written.spec.unschedulable, false, "spec written through /status is dropped");

    const ahead = { ...written, status: { ...status, observedEpoch: written.spec.epoch + 1 } };
    assert.match(
      await refusal(
        objects.replaceNamespacedCustomObjectStatus({ ...at(FORKD_NODE), name: "node-a", body: ahead }),
      ),
      /status.observedEpoch cannot be ahead of spec.epoch/,
    );
    const twice = { ...written, status: { ...status, snapshots: [{ digest: DIGEST }, { digest: DIGEST }] } };
    assert.match(
      await refusal(
        objects.replaceNamespacedCustomObjectStatus({ ...at(FORKD_NODE), name: "node-a", body: twice }),
      ),
      /Duplicate value/,
    );
  });

  it("scales a warm pool through /scale, as an autoscaler does", async () => {
    const scale = await objects.getNamespacedCustomObjectScale({ ...at(FORKD_WARM_POOL), name: "pyagent" });
    assert.equal((scale as { spec: { replicas: number } }).spec.replicas, 4);
    await objects.replaceNamespacedCustomObjectScale({
      ...at(FORKD_WARM_POOL),
      name: "pyagent",
      body: { ...(scale as Body), spec: { replicas: 9 } },
    });
    assert.equal((await get<ForkdWarmPool>(FORKD_WARM_POOL, "pyagent")).spec.replicas, 9);
    const poolNow = await get<ForkdWarmPool>(FORKD_WARM_POOL, "pyagent");
    await objects.replaceNamespacedCustomObjectStatus({
      ...at(FORKD_WARM_POOL),
      name: "pyagent",
      body: { ...poolNow, status: { replicas: 5, nodes: [{ name: "node-a", ready: 5 }] } },
    });
    const after = await objects.getNamespacedCustomObjectScale({ ...at(FORKD_WARM_POOL), name: "pyagent" });
    assert.equal((after as { status: { replicas: number } }).status.replicas, 5);
  });

  it("prints the declared columns in kubectl get, and `kubectl get forkd` lists every kind", async () => {
    const kubectl = async (...args: string[]) =>
      (
        await promisify(execFile)(
          cluster.tools.kubectl,
          ["--kubeconfig", cluster.kubeconfigPath, "-n", NAMESPACE, ...args],
          {
            encoding: "utf8",
          },
        )
      ).stdout;
    const nodes = (await kubectl("get", "forkdnodes")).split("\n");
    assert.match(nodes[0] ?? "", /^NAME\s+READY\s+VERSION\s+EPOCH\s+SANDBOXES\s+CAPACITY\s+AGE$/);
    assert.match(nodes[1] ?? "", /^node-a\s+True\s+0\.1\.0\s+3\s+7\s+100\s+\S+$/);
    const wide = (await kubectl("get", "fdn", "-o", "wide")).split("\n")[0] ?? "";
    assert.match(wide, /UNSCHEDULABLE\s+URL/);
    assert.match(
      (await kubectl("get", "forkdsnapshots")).split("\n")[0] ?? "",
      /^NAME\s+REFERENCE\s+PREPULL\s+HOLDERS\s+READY\s+AGE$/,
    );
    assert.match((await kubectl("get", "fdwp")).split("\n")[1] ?? "", /^pyagent\s+pyagent\s+9\s+5\s+\S+$/);
    const all = await kubectl("get", "forkd", "-o", "name");
    for (const kind of FORKD_KINDS)
      assert.match(all, new RegExp(`^${kind.singular}\\.${FORKD_API_GROUP.replace(".", "\\.")}/`, "m"));
  });
});
