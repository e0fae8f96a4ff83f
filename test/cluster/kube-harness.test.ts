/**
 * The test control plane (test/support/kube-cluster.ts) is the real thing: kube-apiserver and etcd built from
 * their modules, RBAC deciding, ServiceAccount tokens from TokenRequest checked by the API server, Leases and
 * watches; and stopping it leaves no process and no file behind.
 */
import assert from "node:assert/strict";
import { access } from "node:fs/promises";
import { after, before, describe, it } from "node:test";
import {
  ApiException,
  CoordinationV1Api,
  CoreV1Api,
  RbacAuthorizationV1Api,
  V1MicroTime,
  VersionApi,
  Watch,
} from "@kubernetes/client-node";
import { processesMentioning, waitFor } from "../support/host.js";
import { type KubeTestCluster, startKubeCluster } from "../support/kube-cluster.js";

const NAMESPACE = "harness";

/** The HTTP status of a failed client call (the client throws ApiException with `code`). */
async function statusOf(call: Promise<unknown>): Promise<number> {
  try {
    await call;
    return 200;
  } catch (err) {
    if (err instanceof ApiException) return err.code;
    throw err;
  }
}

describe("test control plane (kube-apiserver + etcd)", () => {
  let cluster: KubeTestCluster;
  let core: CoreV1Api;

  before(async () => {
    const started = Date.now();
    cluster = await startKubeCluster();
    process.stderr.write(`kube-apiserver ready after ${Date.now() - started} ms\n`);
    core = cluster.admin.makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: NAMESPACE } } });
    await core.createNamespacedServiceAccount({
      namespace: NAMESPACE,
      body: { metadata: { name: "reader" } },
    });
  });
  after(async () => {
    await cluster?.stop();
  });

  it("serves the release scripts/k8s-tools.sh built", async () => {
    const version = await cluster.admin.makeApiClient(VersionApi).getCode();
    assert.equal(version.gitVersion, "v1.37.2");
  });

  it("authorizes a ServiceAccount's token by RBAC: nothing until a Role grants it", async () => {
    const token = await cluster.tokenFor(NAMESPACE, "reader");
    const asReader = cluster.configForToken(token).makeApiClient(CoreV1Api);
    assert.equal(await statusOf(asReader.listNamespacedConfigMap({ namespace: NAMESPACE })), 403);
    const rbac = cluster.admin.makeApiClient(RbacAuthorizationV1Api);
    await rbac.createNamespacedRole({
      namespace: NAMESPACE,
      body: {
        metadata: { name: "read-configmaps" },
        rules: [{ apiGroups: [""], resources: ["configmaps"], verbs: ["get", "list"] }],
      },
    });
    await rbac.createNamespacedRoleBinding({
      namespace: NAMESPACE,
      body: {
        metadata: { name: "reader" },
        roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "read-configmaps" },
        subjects: [{ kind: "ServiceAccount", name: "reader", namespace: NAMESPACE }],
      },
    });
    // The authorizer reads Roles from its informer cache: a grant takes effect within moments.
    await waitFor("the Role to take effect", 10_000, async () =>
      (await statusOf(asReader.listNamespacedConfigMap({ namespace: NAMESPACE }))) === 200 ? true : undefined,
    );
    assert.equal(await statusOf(asReader.listNamespacedSecret({ namespace: NAMESPACE })), 403);
  });

  it("checks tokens: a forged one and one whose ServiceAccount is gone are refused", async () => {
    await core.createNamespacedServiceAccount({
      namespace: NAMESPACE,
      body: { metadata: { name: "short-lived" } },
    });
    const token = await cluster.tokenFor(NAMESPACE, "short-lived");
    const asIt = (t: string) => cluster.configForToken(t).makeApiClient(CoreV1Api);
    // Authenticated (403: no rights), not refused (401).
    assert.equal(await statusOf(asIt(token).listNamespacedPod({ namespace: NAMESPACE })), 403);
    const [header, payload, signature] = token.split(".") as [string, string, string];
    const flipped = `${signature.slice(0, -2)}${signature.endsWith("A") ? "B" : "A"}${signature.slice(-1)}`;
    assert.equal(
      await statusOf(asIt(`${header}.${payload}.${flipped}`).listNamespacedPod({ namespace: NAMESPACE })),
      401,
    );
    await core.deleteNamespacedServiceAccount({ name: "short-lived", namespace: NAMESPACE });
    await waitFor("the deleted account's token to be refused", 10_000, async () =>
      (await statusOf(asIt(token).listNamespacedPod({ namespace: NAMESPACE }))) === 401 ? true : undefined,
    );
  });

  // Lease times are MicroTime (six decimals): the client's V1MicroTime writes them so, a plain Date does not.
  it("stores Leases and streams their changes to a watch", async () => {
    const leases = cluster.admin.makeApiClient(CoordinationV1Api);
    const seen: { type: string; holder?: string; renew?: string }[] = [];
    const watch = await new Watch(cluster.admin).watch(
      `/apis/coordination.k8s.io/v1/namespaces/${NAMESPACE}/leases`,
      {},
      (type, object: { spec?: { holderIdentity?: string; renewTime?: string } }) => {
        seen.push({ type, holder: object.spec?.holderIdentity, renew: object.spec?.renewTime });
      },
      () => {},
    );
    try {
      const created = await leases.createNamespacedLease({
        namespace: NAMESPACE,
        body: {
          metadata: { name: "node-a" },
          spec: { holderIdentity: "node-a", leaseDurationSeconds: 15, renewTime: new V1MicroTime() },
        },
      });
      await leases.replaceNamespacedLease({
        name: "node-a",
        namespace: NAMESPACE,
        body: { ...created, spec: { ...created.spec, renewTime: new V1MicroTime(Date.now() + 5_000) } },
      });
      await waitFor("ADDED then MODIFIED", 10_000, async () =>
        seen.some((e) => e.type === "MODIFIED") ? true : undefined,
      );
      assert.deepEqual(
        seen.map((e) => [e.type, e.holder]),
        [
          ["ADDED", "node-a"],
          ["MODIFIED", "node-a"],
        ],
      );
      // A stale write (an old resourceVersion) is refused: renewals cannot silently overwrite each other.
      assert.equal(
        await statusOf(
          leases.replaceNamespacedLease({ name: "node-a", namespace: NAMESPACE, body: created }),
        ),
        409,
      );
    } finally {
      watch.abort();
    }
  });

  it("stops both processes and removes its directory", async () => {
    assert.ok((await processesMentioning(cluster.dir)).length >= 2, "etcd and kube-apiserver run from it");
    await cluster.stop();
    assert.deepEqual(await processesMentioning(cluster.dir), []);
    await assert.rejects(access(cluster.dir), { code: "ENOENT" });
  });
});
