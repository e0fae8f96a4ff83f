/**
 * forkd's deployment files against the real API server: the generated files are current; the chart (default
 * values) and the kustomize base render the same objects; `helm install` applies the chart; every rendered
 * object (both renders, and the chart with its options turned on) is accepted by a server-side dry-run with
 * strict field validation; the admission policies type-check against the CRDs; and each component's
 * ServiceAccount has exactly its rights, by access reviews and by real writes the policies refuse.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import {
  ApiException,
  AuthenticationV1Api,
  AuthorizationV1Api,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  type KubeConfig,
  V1MicroTime,
} from "@kubernetes/client-node";
import {
  CONTROLLER_LEASE_NAME,
  type Component,
  DEFAULT_NAMESPACE,
  FORKD_API,
  FORKD_API_GROUP,
  FORKD_API_VERSION,
  FORKD_NODE,
  serviceAccountName,
  TOKENS_SECRET_NAME,
} from "../../src/cluster/api-group.js";
import type { ForkdNode } from "../../src/cluster/schemas.js";
import {
  CHART_DIR,
  expectedCrdFiles,
  expectedKustomizeFiles,
  helmEnv,
  KUSTOMIZE_BASE,
  type Manifest,
  objectKey,
  renderChart,
  renderChartText,
  renderKustomize,
} from "../support/deploy-files.js";
import { type KubeTestCluster, startKubeCluster } from "../support/kube-cluster.js";
import { kubeTools } from "../support/kube-tools.js";

const run = promisify(execFile);
const NS = DEFAULT_NAMESPACE;
/** The chart with every option the defaults leave off turned on (or the other way round). */
const ALL_OPTIONS = [
  ...[
    "--set",
    "node.tlsSecretName=forkd-node-tls",
    "--set",
    "node.kvm=false",
    "--set",
    "node.maxSandboxes=50",
  ],
  ...[
    "--set",
    "node.clusterRegistry=registry.forkd.svc:5000",
    "--set",
    "node.clusterRegistryInsecure=true",
    "--set",
    "gateway.durablePause=true",
  ],
  ...["--set", "tokens.nodeToken=0123456789abcdef0123", "--set", "gateway.ingress.tlsSecretName=forkd-tls"],
  ...["--set", "gateway.ingress.className=nginx", "--set", "node.priorityClassName=system-node-critical"],
  ...[
    "--set-json",
    'imagePullSecrets=[{"name":"regcred"}]',
    "--set-json",
    'node.extraArgs=["--log-level=debug"]',
  ],
];

async function statusOf(call: Promise<unknown>): Promise<{ code: number; message: string }> {
  try {
    await call;
    return { code: 200, message: "" };
  } catch (err) {
    if (!(err instanceof ApiException)) throw err;
    return { code: err.code, message: String(JSON.parse(String(err.body)).message ?? err.body) };
  }
}

describe("deployment files (generated, rendered)", () => {
  it("the chart's CRDs are the ones src/cluster declares", async () => {
    for (const [name, text] of expectedCrdFiles()) {
      const committed = await readFile(path.join(CHART_DIR, name), "utf8").catch(() => "");
      assert.equal(committed, text, `deploy/helm/forkd/${name} is stale: run npm run deploy:write`);
    }
    assert.deepEqual(
      (await readdir(path.join(CHART_DIR, "crds"))).sort(),
      [...expectedCrdFiles().keys()].map((n) => path.basename(n)).sort(),
    );
  });

  it("the kustomize base is the chart rendered with its default values", async () => {
    const expected = expectedKustomizeFiles(await renderChartText(await kubeTools()));
    for (const [name, text] of expected) {
      const committed = await readFile(path.join(KUSTOMIZE_BASE, name), "utf8").catch(() => "");
      assert.equal(committed, text, `deploy/kustomize/base/${name} is stale: run npm run deploy:write`);
    }
    assert.deepEqual((await readdir(KUSTOMIZE_BASE)).sort(), [...expected.keys()].sort());
  });

  it("helm template and kubectl kustomize give the same set of objects", async () => {
    const tools = await kubeTools();
    const byKey = (objects: Manifest[]) => new Map(objects.map((o) => [objectKey(o), o]));
    const chart = byKey(await renderChart(tools));
    const kustomize = byKey(await renderKustomize(tools));
    assert.deepEqual([...kustomize.keys()].sort(), [...chart.keys()].sort());
    for (const [key, object] of chart) assert.deepEqual(kustomize.get(key), object, key);
    // What the brief of the files promises, so a template that stops rendering an object fails here.
    const kinds = [...chart.values()].map((o) => o.kind);
    for (const kind of ["Namespace", "CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding"])
      assert.ok(kinds.includes(kind), kind);
    for (const kind of ["DaemonSet", "Deployment", "PodDisruptionBudget", "Service", "Ingress", "Secret"])
      assert.ok(kinds.includes(kind), kind);
    assert.equal(kinds.filter((k) => k === "CustomResourceDefinition").length, 3);
  });

  it("refuses tokens shorter than 16 characters when rendering", async () => {
    await assert.rejects(
      renderChart(await kubeTools(), ["--set", "tokens.adminToken=short"]),
      /at least 16 characters/,
    );
  });

  it("gateway.durablePause passes --durable-pause, node.clusterRegistry --cluster-registry; one needs the other", async () => {
    const tools = await kubeTools();
    const argsOf = (objects: Manifest[], kind: string) => {
      const name = kind === "Deployment" ? "forkd-gateway" : "forkd-node";
      const o = objects.find((x) => x.kind === kind && x.metadata?.name === name) as unknown as {
        spec: { template: { spec: { containers: { args: string[] }[] } } };
      };
      return o.spec.template.spec.containers[0]?.args ?? [];
    };
    const on = await renderChart(tools, ALL_OPTIONS);
    assert.ok(argsOf(on, "Deployment").includes("--durable-pause"));
    assert.ok(argsOf(on, "DaemonSet").includes("--cluster-registry=registry.forkd.svc:5000"));
    assert.ok(argsOf(on, "DaemonSet").includes("--cluster-registry-insecure"));
    const off = await renderChart(tools);
    assert.ok(!argsOf(off, "Deployment").includes("--durable-pause"));
    assert.ok(!argsOf(off, "DaemonSet").some((a) => a.startsWith("--cluster-registry")));
    await assert.rejects(
      renderChart(tools, ["--set", "gateway.durablePause=true"]),
      /gateway.durablePause needs node.clusterRegistry/,
    );
  });
});

describe("deployment files on the API server", () => {
  let cluster: KubeTestCluster;
  const kubectl = (...args: string[]) =>
    run(cluster.tools.kubectl, ["--kubeconfig", cluster.kubeconfigPath, ...args], { encoding: "utf8" });
  const asComponent = new Map<Component, KubeConfig>();

  before(async () => {
    cluster = await startKubeCluster();
    const { stderr } = await run(
      cluster.tools.helm,
      ["install", "forkd", CHART_DIR, "--kubeconfig", cluster.kubeconfigPath, "--namespace", "default"],
      { encoding: "utf8", env: helmEnv() },
    );
    if (stderr.trim() !== "") process.stderr.write(`helm install: ${stderr}\n`);
    for (const component of ["node", "gateway", "controller"] as const) {
      const token = await cluster.tokenFor(NS, serviceAccountName(component));
      asComponent.set(component, cluster.configForToken(token));
    }
  });
  after(async () => {
    await cluster?.stop();
  });

  it("helm install applied every object the chart renders", async () => {
    const rendered = await renderChart(cluster.tools);
    const names = rendered.map((o) => `${o.kind}/${o.metadata.name}`);
    const { stdout } = await kubectl(
      "get",
      "-n",
      NS,
      "daemonsets,deployments,services,ingresses,pdb,secrets,serviceaccounts,roles,rolebindings",
      "-o",
      "name",
    );
    for (const object of rendered.filter((o) => o.metadata.namespace === NS)) {
      const kind = object.kind.toLowerCase();
      assert.match(
        stdout,
        new RegExp(`^${kind}[^/]*/${object.metadata.name}$`, "m"),
        `${kind}/${object.metadata.name}`,
      );
    }
    assert.ok(names.includes("DaemonSet/forkd-node"));
  });

  it("accepts every object of both renders in a server-side dry-run (strict field validation)", async () => {
    const chartWithOptions = path.join(cluster.dir, "chart-all-options.yaml");
    await writeFile(chartWithOptions, await renderChartText(cluster.tools, ALL_OPTIONS));
    const chartDefault = path.join(cluster.dir, "chart-default.yaml");
    await writeFile(chartDefault, await renderChartText(cluster.tools));
    for (const source of [
      ["-f", chartDefault],
      ["-f", chartWithOptions],
      ["-k", KUSTOMIZE_BASE],
    ]) {
      const { stdout } = await kubectl(
        ...[
          "apply",
          "--server-side",
          "--force-conflicts",
          "--dry-run=server",
          "--validate=strict",
          ...source,
        ],
      );
      assert.match(
        stdout,
        /daemonset\.apps\/forkd-node serverside-applied \(server dry run\)/,
        source.join(" "),
      );
    }
    // The dry-run checks what it would write: a misspelt field is refused, not dropped.
    const typo = (await readFile(chartDefault, "utf8")).replace("hostNetwork: true", "hostNetwrok: true");
    const typoFile = path.join(cluster.dir, "typo.yaml");
    await writeFile(typoFile, typo);
    await assert.rejects(
      kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        typoFile,
      ),
      /spec\.template\.spec\.hostNetwrok: field not declared in schema/,
    );
  });

  /** Each component's rights, asked as that component (SelfSubjectAccessReview with its own token). */
  const RIGHTS: [Component, string, string, string, boolean, string?][] = [
    // component, verb, group, resource[/subresource], allowed, name
    ["node", "create", FORKD_API_GROUP, "forkdnodes", true],
    ["node", "watch", FORKD_API_GROUP, "forkdnodes", true],
    ["node", "patch", FORKD_API_GROUP, "forkdnodes/status", true],
    ["node", "delete", FORKD_API_GROUP, "forkdnodes", false],
    ["node", "update", "coordination.k8s.io", "leases", true],
    ["node", "delete", "coordination.k8s.io", "leases", false],
    ["node", "get", "", "secrets", false, TOKENS_SECRET_NAME],
    ["node", "list", "", "secrets", false],
    ["node", "get", FORKD_API_GROUP, "forkdsnapshots", false],
    ["node", "update", FORKD_API_GROUP, "forkdwarmpools", false],
    ["node", "create", "", "pods", false],
    ["gateway", "list", FORKD_API_GROUP, "forkdnodes", true],
    ["gateway", "watch", FORKD_API_GROUP, "forkdsnapshots", true],
    ["gateway", "get", FORKD_API_GROUP, "forkdwarmpools", true],
    ["gateway", "watch", "coordination.k8s.io", "leases", true],
    ["gateway", "update", FORKD_API_GROUP, "forkdnodes", false],
    ["gateway", "patch", FORKD_API_GROUP, "forkdnodes/status", false],
    ["gateway", "create", "coordination.k8s.io", "leases", false],
    ["gateway", "get", "", "secrets", false, TOKENS_SECRET_NAME],
    ["gateway", "update", FORKD_API_GROUP, "forkdwarmpools/scale", false],
    ["controller", "update", FORKD_API_GROUP, "forkdnodes", true],
    ["controller", "update", FORKD_API_GROUP, "forkdnodes/status", false],
    ["controller", "delete", FORKD_API_GROUP, "forkdnodes", false],
    ["controller", "update", FORKD_API_GROUP, "forkdsnapshots/status", true],
    ["controller", "update", FORKD_API_GROUP, "forkdwarmpools/status", true],
    ["controller", "update", FORKD_API_GROUP, "forkdwarmpools", false],
    ["controller", "create", "coordination.k8s.io", "leases", true],
    ["controller", "update", "coordination.k8s.io", "leases", true, CONTROLLER_LEASE_NAME],
    ["controller", "update", "coordination.k8s.io", "leases", false, "node-a"],
    ["controller", "get", "", "secrets", true, TOKENS_SECRET_NAME],
    ["controller", "update", "", "secrets", true, TOKENS_SECRET_NAME],
    ["controller", "get", "", "secrets", false, "another-secret"],
    ["controller", "list", "", "secrets", false],
  ];

  it("gives each component's ServiceAccount exactly its rights (SelfSubjectAccessReview, own token)", async () => {
    const wrong: string[] = [];
    for (const [component, verb, group, full, allowed, name] of RIGHTS) {
      const [resource, subresource] = full.split("/") as [string, string | undefined];
      const review = await asComponent
        .get(component)!
        .makeApiClient(AuthorizationV1Api)
        .createSelfSubjectAccessReview({
          body: { spec: { resourceAttributes: { namespace: NS, verb, group, resource, subresource, name } } },
        });
      if (review.status?.allowed !== allowed)
        wrong.push(`${component} ${verb} ${full} ${name ?? ""}: ${review.status?.allowed}`);
    }
    assert.deepEqual(wrong, []);
    // And from outside (SubjectAccessReview by the admin): no right in another namespace.
    const outside = await cluster.admin.makeApiClient(AuthorizationV1Api).createSubjectAccessReview({
      body: {
        spec: {
          user: `system:serviceaccount:${NS}:${serviceAccountName("controller")}`,
          resourceAttributes: {
            namespace: "default",
            verb: "update",
            group: FORKD_API_GROUP,
            resource: "forkdnodes",
          },
        },
      },
    });
    assert.equal(outside.status?.allowed, false);
  });

  describe("admission: a node writes only its own objects", () => {
    const objects = (config: KubeConfig) => config.makeApiClient(CustomObjectsApi);
    const leases = (config: KubeConfig) => config.makeApiClient(CoordinationV1Api);
    const forkdNode = (name: string, epoch = 0): ForkdNode => ({
      apiVersion: FORKD_API,
      kind: "ForkdNode",
      metadata: { name },
      spec: { url: `http://10.1.0.${name.endsWith("a") ? 1 : 2}:8889`, epoch, unschedulable: false },
    });
    const at = {
      group: FORKD_API_GROUP,
      version: FORKD_API_VERSION,
      namespace: NS,
      plural: FORKD_NODE.plural,
    };
    const createNode = (config: KubeConfig, body: ForkdNode) =>
      statusOf(objects(config).createNamespacedCustomObject({ ...at, body }));
    const lease = (name: string) => ({
      metadata: { name },
      spec: { holderIdentity: name, leaseDurationSeconds: 15, renewTime: new V1MicroTime() },
    });
    let nodeA: KubeConfig;

    before(async () => {
      // What a kubelet's registration and the DaemonSet would make: Node objects and pods bound to them.
      const core = cluster.admin.makeApiClient(CoreV1Api);
      for (const name of ["node-a", "node-b"]) {
        await core.createNode({ body: { metadata: { name, labels: { "forkd.dev/node": "true" } } } });
      }
      const pod = await core.createNamespacedPod({
        namespace: NS,
        body: {
          metadata: { name: "forkd-node-a" },
          spec: {
            nodeName: "node-a",
            serviceAccountName: serviceAccountName("node"),
            containers: [{ name: "daemon", image: "forkd:test" }],
          },
        },
      });
      const token = await cluster.tokenFor(NS, serviceAccountName("node"), {
        pod: { name: "forkd-node-a", uid: pod.metadata!.uid! },
      });
      nodeA = cluster.configForToken(token);
    });

    it("its pod-bound token names its node", async () => {
      const review = await nodeA.makeApiClient(AuthenticationV1Api).createSelfSubjectReview({ body: {} });
      assert.equal(
        review.status?.userInfo?.username,
        `system:serviceaccount:${NS}:${serviceAccountName("node")}`,
      );
      assert.deepEqual(review.status?.userInfo?.extra?.["authentication.kubernetes.io/node-name"], [
        "node-a",
      ]);
    });

    it("registers its own ForkdNode and Lease, not another node's", async () => {
      assert.equal((await createNode(nodeA, forkdNode("node-a"))).code, 200);
      const other = await createNode(nodeA, forkdNode("node-b"));
      assert.equal(other.code, 403);
      assert.match(other.message, /the forkd node daemon on node-a may write only the objects named node-a/);
      assert.equal(
        (await statusOf(leases(nodeA).createNamespacedLease({ namespace: NS, body: lease("node-a") }))).code,
        200,
      );
      assert.equal(
        (await statusOf(leases(nodeA).createNamespacedLease({ namespace: NS, body: lease("node-b") }))).code,
        403,
      );
    });

    it("reports its status but cannot set its own epoch or cordon state", async () => {
      const mine = (await objects(nodeA).getNamespacedCustomObject({ ...at, name: "node-a" })) as ForkdNode;
      const status = await statusOf(
        objects(nodeA).replaceNamespacedCustomObjectStatus({
          ...at,
          name: "node-a",
          body: { ...mine, status: { version: "0.1.0", observedEpoch: 0, sandboxes: 0 } },
        }),
      );
      assert.equal(status.code, 200);
      const current = (await objects(nodeA).getNamespacedCustomObject({
        ...at,
        name: "node-a",
      })) as ForkdNode;
      const raised = await statusOf(
        objects(nodeA).replaceNamespacedCustomObject({
          ...at,
          name: "node-a",
          body: { ...current, spec: { ...current.spec, epoch: current.spec.epoch + 1 } },
        }),
      );
      assert.equal(raised.code, 403, raised.message);
      assert.match(raised.message, /spec.epoch and spec.unschedulable are set by the controller/);
    });

    it("a node-side token not bound to a pod writes nothing", async () => {
      const unbound = cluster.configForToken(await cluster.tokenFor(NS, serviceAccountName("node")));
      const answer = await createNode(unbound, forkdNode("node-b"));
      assert.equal(answer.code, 403);
      assert.match(answer.message, /must use a token bound to its pod/);
    });

    it("the controller fences a node but cannot move it, and holds no Lease but its own", async () => {
      const controller = asComponent.get("controller")!;
      const current = (await objects(controller).getNamespacedCustomObject({
        ...at,
        name: "node-a",
      })) as ForkdNode;
      const fenced = await statusOf(
        objects(controller).replaceNamespacedCustomObject({
          ...at,
          name: "node-a",
          body: { ...current, spec: { ...current.spec, epoch: current.spec.epoch + 1 } },
        }),
      );
      assert.equal(fenced.code, 200);
      const after = (await objects(controller).getNamespacedCustomObject({
        ...at,
        name: "node-a",
      })) as ForkdNode;
      const moved = await statusOf(
        objects(controller).replaceNamespacedCustomObject({
          ...at,
          name: "node-a",
          body: { ...after, spec: { ...after.spec, url: "http://attacker.example:80" } },
        }),
      );
      assert.equal(moved.code, 403);
      assert.equal(
        (await statusOf(leases(controller).createNamespacedLease({ namespace: NS, body: lease("node-c") })))
          .code,
        403,
      );
      assert.equal(
        (
          await statusOf(
            leases(controller).createNamespacedLease({ namespace: NS, body: lease(CONTROLLER_LEASE_NAME) }),
          )
        ).code,
        200,
      );
      assert.equal(
        (
          await statusOf(
            leases(nodeA).createNamespacedLease({ namespace: NS, body: lease(CONTROLLER_LEASE_NAME) }),
          )
        ).code,
        403,
      );
    });

    it("the gateway reads nodes and writes none", async () => {
      const gateway = asComponent.get("gateway")!;
      const list = (await objects(gateway).listNamespacedCustomObject(at)) as { items: ForkdNode[] };
      assert.deepEqual(
        list.items.map((n) => n.metadata.name),
        ["node-a"],
      );
      assert.equal((await createNode(gateway, forkdNode("node-b"))).code, 403);
    });
  });
});
