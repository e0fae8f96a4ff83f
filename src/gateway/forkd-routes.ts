/**
 * The forkd REST routes the gateway answers itself, because they concern more than one sandbox or node: spawn
 * (placement), the lists and kill-all (every node), snapshots (wherever they are), fork (fork.ts: across nodes
 * when one cannot hold the children), and the cluster's own state. Every other /v1/sandboxes/<id>/... call is
 * relayed to the sandbox's node as it is (server.ts). Each sandbox or snapshot the gateway answers with says
 * on which node it is (`node`), a field a single daemon does not send.
 */
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance, FastifyRequest } from "fastify";
import {
  BranchBody,
  ForkBody,
  KillManyQuery,
  ListSandboxesQuery,
  OptionalBody,
  PauseBody,
  SandboxParams,
  SpawnBody,
  TagParams,
} from "../api/schemas.js";
import type { SandboxRef } from "../cluster/protocol.js";
import { ForkdError, notFound } from "../common/errors.js";
import { FORKD_VERSION } from "../common/version.js";
import type { GatewayContext } from "./context.js";
import { pauseIsDurable, pauseThenMakeDurable } from "./durable-pause.js";
import { fanout } from "./fanout.js";
import { forkAcrossNodes } from "./fork.js";
import { withoutHostPaths } from "./host-paths.js";
import { serverTiming } from "./proxy.js";
import type { SpawnedSandbox } from "./spawn.js";

declare module "fastify" {
  interface FastifyContextConfig {
    /** How the gateway authenticates the route's callers, and the shape of its errors. */
    surface?: "forkd" | "e2b" | "public";
  }
  interface FastifyRequest {
    /** The tenant the caller acts for (null: an admin), set by the gateway's authentication. */
    tenant: string | null;
    callerId: string;
  }
}

const forkd = { config: { surface: "forkd" as const } };

export function registerForkdRoutes(app: FastifyInstance, context: GatewayContext): void {
  registerStatusRoutes(app, context);
  registerSandboxRoutes(app, context);
  registerSnapshotRoutes(app, context);
  registerNodeSettingRoutes(app, context);
}

/** Health, version and the cluster's own state. */
function registerStatusRoutes(app: FastifyInstance, context: GatewayContext): void {
  app.get("/healthz", { config: { surface: "public" } }, async () => ({
    status: "ok",
    version: FORKD_VERSION,
  }));
  app.get("/version", forkd, async () => ({ version: FORKD_VERSION, component: "gateway" }));
  app.get("/v1/cluster", forkd, async (request) => {
    adminOnly(request, "the cluster's state");
    return clusterState(context);
  });
}

/** Spawn (placed here), the lists and kill-all (every node), fork (across nodes). */
function registerSandboxRoutes(app: FastifyInstance, context: GatewayContext): void {
  registerSpawnRoute(app, context);
  app.get<{ Querystring: Static<typeof ListSandboxesQuery> }>(
    "/v1/sandboxes",
    { ...forkd, schema: { querystring: ListSandboxesQuery } },
    async (request, reply) => {
      const answers = await fanout<SpawnedSandbox[]>(
        context,
        { method: "GET", path: "/v1/sandboxes", query: request.query },
        request.tenant,
        reply,
      );
      return answers
        .flatMap((a) => a.value.map((s) => ({ ...s, node: a.node })))
        .sort((a, b) => a.created_at_unix - b.created_at_unix || a.id.localeCompare(b.id));
    },
  );

  app.delete<{ Querystring: Static<typeof KillManyQuery> }>(
    "/v1/sandboxes",
    { ...forkd, schema: { querystring: KillManyQuery } },
    async (request, reply) => {
      const answers = await fanout<{ killed: string[] }>(
        context,
        { method: "DELETE", path: "/v1/sandboxes", query: request.query },
        request.tenant,
        reply,
      );
      return { killed: answers.flatMap((a) => a.value.killed) };
    },
  );

  app.post<{ Params: Static<typeof SandboxParams>; Body: Static<typeof ForkBody> }>(
    "/v1/sandboxes/:id/fork",
    { ...forkd, schema: { params: SandboxParams, body: ForkBody } },
    async (request) => forkAcrossNodes(context, request.tenant, request.params.id, request.body ?? {}),
  );
  registerBranchRoute(app, context);
  registerPauseRoute(app, context);
}

/**
 * A pause is the node's; answered here so that a durable one (docs/kubernetes.md, "The durable pause":
 * `durable: true`, or under the gateway's --durable-pause any pause with memory that does not say
 * `durable: false`) can follow it: the node then pushes the pause chain and lists it in its ForkdNode; the
 * answer waits for both (durable-pause.ts). One that could not be made durable stays paused, and says so (503).
 */
function registerPauseRoute(app: FastifyInstance, context: GatewayContext): void {
  app.post<{ Params: Static<typeof SandboxParams>; Body: Static<typeof PauseBody> | null | undefined }>(
    "/v1/sandboxes/:id/pause",
    // No body is a pause with the defaults, as at a single daemon.
    { ...forkd, schema: { params: SandboxParams, body: OptionalBody(PauseBody) } },
    async (request) => {
      const id = request.params.id;
      const { durable: asked, ...body } = request.body ?? {};
      const placement = await context.locator.locate(id, request.tenant);
      const durable = pauseIsDurable(context, asked, body.memory);
      const call = { method: "POST" as const, path: `/v1/sandboxes/${id}/pause`, json: body, deadlineMs: 0 };
      const pause = () => context.calls.json<Record<string, unknown>>(placement.node, call, request.tenant);
      if (!durable) return { ...(await pause()), node: placement.node };
      const made = await pauseThenMakeDurable(context, id, placement.node, pause);
      return { ...made.paused, node: placement.node, durable: made.durable };
    },
  );
}

/** A spawn: placed here (placement.ts), each node's share sent as the caller's tenant. */
function registerSpawnRoute(app: FastifyInstance, context: GatewayContext): void {
  app.post<{ Body: Static<typeof SpawnBody> }>(
    "/v1/sandboxes",
    { ...forkd, schema: { body: SpawnBody } },
    async (request, reply) => {
      const body = request.body;
      const target = await context.placer.resolve(body.snapshot_tag, request.tenant);
      let nodeMs = 0;
      const children = await context.spawner.spawn(
        request.tenant,
        target,
        body.n ?? 1,
        async (share) => {
          const sent = performance.now();
          try {
            return await context.calls.json<SpawnedSandbox[]>(
              share.node,
              {
                method: "POST",
                path: "/v1/sandboxes",
                json: { ...body, snapshot_tag: target.tag, n: share.count },
                deadlineMs: 0,
              },
              request.tenant,
            );
          } finally {
            // Shares run in parallel: the longest is what the spawn waited on nodes.
            nodeMs = Math.max(nodeMs, performance.now() - sent);
          }
        },
        (answer) => answer,
      );
      reply.status(201);
      // elapsedTime: since the request arrived (Fastify's onRequest), parsing and authentication included.
      reply.header("server-timing", serverTiming(reply.elapsedTime - nodeMs, nodeMs));
      return children.flatMap((child) => child.value.map((s) => ({ ...s, node: child.node })));
    },
  );
}

/** BRANCH is the node's, answered here (not relayed as it is) so that its snapshot record loses host paths. */
function registerBranchRoute(app: FastifyInstance, context: GatewayContext): void {
  app.post<{ Params: Static<typeof SandboxParams>; Body: Static<typeof BranchBody> }>(
    "/v1/sandboxes/:id/branch",
    { ...forkd, schema: { params: SandboxParams, body: BranchBody } },
    async (request, reply) => {
      const id = request.params.id;
      const placement = await context.locator.locate(id, request.tenant);
      const answer = await context.calls.json<SnapshotWire & { status?: string; owner?: string | null }>(
        placement.node,
        { method: "POST", path: `/v1/sandboxes/${id}/branch`, json: request.body, deadlineMs: 0 },
        request.tenant,
      );
      // Known here at once (a spawn of it may come before the node's stream reports it); other replicas ask
      // the nodes on a miss (placement.ts).
      const epoch = context.calls.epochOf(placement.node) ?? placement.epoch;
      const owner = answer.owner ?? request.tenant;
      context.directory.learnSnapshot(placement.node, epoch, { tag: answer.tag, owner, digest: null });
      reply.status(answer.status === "writing" ? 202 : 201);
      return { ...withoutHostPaths(answer), node: placement.node };
    },
  );
}

/** Snapshots, wherever in the cluster they are. */
function registerSnapshotRoutes(app: FastifyInstance, context: GatewayContext): void {
  app.get("/v1/snapshots", forkd, async (request, reply) => {
    const answers = await fanout<SnapshotWire[]>(
      context,
      { method: "GET", path: "/v1/snapshots" },
      request.tenant,
      reply,
    );
    const byTag = new Map<string, Omit<SnapshotWire, "dir"> & { nodes: string[] }>();
    for (const answer of answers) {
      for (const snapshot of answer.value) {
        const known = byTag.get(snapshot.tag);
        if (known) known.nodes.push(answer.node);
        else byTag.set(snapshot.tag, { ...withoutHostPaths(snapshot), nodes: [answer.node] });
      }
    }
    return [...byTag.values()].sort((a, b) => a.tag.localeCompare(b.tag));
  });

  for (const suffix of ["", "/info"]) {
    app.get<{ Params: Static<typeof TagParams> }>(
      `/v1/snapshots/:tag${suffix}`,
      { ...forkd, schema: { params: TagParams } },
      async (request) => {
        const tag = request.params.tag;
        for (const node of snapshotNodes(context, tag)) {
          try {
            const info = await context.calls.json<Record<string, unknown>>(
              node,
              { method: "GET", path: `/v1/snapshots/${encodeURIComponent(tag)}${suffix}` },
              request.tenant,
            );
            return { ...withoutHostPaths(info), node };
          } catch (err) {
            if (!(err instanceof ForkdError) || err.code !== "not_found") throw err;
          }
        }
        throw notFound(`snapshot ${JSON.stringify(tag)} not found in the cluster`);
      },
    );
  }

  app.delete<{ Params: Static<typeof TagParams>; Querystring: { cascade?: boolean; force?: boolean } }>(
    "/v1/snapshots/:tag",
    { ...forkd, schema: { params: TagParams } },
    async (request) => {
      const tag = request.params.tag;
      const nodes = snapshotNodes(context, tag);
      const deleted: string[] = [];
      let found = false;
      for (const node of nodes) {
        try {
          const answer = await context.calls.json<{ deleted?: string[] } | null>(
            node,
            { method: "DELETE", path: `/v1/snapshots/${encodeURIComponent(tag)}`, query: request.query },
            request.tenant,
          );
          found = true;
          deleted.push(...(answer?.deleted ?? [tag]));
        } catch (err) {
          if (!(err instanceof ForkdError) || err.code !== "not_found") throw err;
        }
      }
      if (!found) throw notFound(`snapshot ${JSON.stringify(tag)} not found in the cluster`);
      return { deleted: [...new Set(deleted)] };
    },
  );
}

/** The nodes' settings (alike across a cluster), and the routes a gateway does not serve. */
function registerNodeSettingRoutes(app: FastifyInstance, context: GatewayContext): void {
  // Settings of the nodes, which a cluster keeps alike: any node that takes calls answers for them.
  for (const path of ["/v1/network", "/v1/confinement", "/v1/template-aliases"]) {
    app.get(path, forkd, async (request) => {
      const node = context.placer.usable()[0];
      if (!node) throw new ForkdError("unavailable", "no node takes calls now");
      return context.calls.json(node.name, { method: "GET", path }, request.tenant);
    });
  }

  for (const [method, url, what] of NOT_IN_A_CLUSTER) {
    app.route({
      method,
      url,
      config: { surface: "forkd" },
      handler: async () => {
        throw new ForkdError("not_implemented", `${what} is not served by the cluster gateway: ${NOT_HERE}`);
      },
    });
  }
}

const NOT_HERE =
  "build snapshots on one forkd host, push them to the registry (forkd push) and declare them as ForkdSnapshots " +
  "(docs/kubernetes.md); sandboxes' own routes work through the gateway";

const NOT_IN_A_CLUSTER: [("GET" | "POST" | "PUT" | "DELETE")[], string, string][] = [
  [["POST"], "/v1/snapshots", "building a snapshot from a template"],
  [["POST"], "/v1/snapshots/unpack", "unpacking a pack"],
  [["GET"], "/v1/snapshots/:tag/pack", "packing a snapshot"],
  [["POST"], "/v1/snapshots/:tag/compact", "compacting a chain"],
  [["POST"], "/v1/snapshots/:tag/diff", "a snapshot diff"],
  [["GET", "POST"], "/v1/workspaces", "forkd v0.5's workspaces"],
  [["GET", "DELETE"], "/v1/workspaces/:name", "forkd v0.5's workspaces"],
  [["POST"], "/v1/workspaces/:name/suspend", "forkd v0.5's workspaces"],
  [["POST"], "/v1/workspaces/:name/resume", "forkd v0.5's workspaces"],
  [["GET"], "/v1/host", "one host's figures (ask a node, or see GET /v1/cluster)"],
  [["GET"], "/v1/usage", "one host's usage (GET /v1/cluster has each node's)"],
];

/** A node's snapshot record: its tag, the host path the gateway drops (host-paths.ts), the rest relayed as it is. */
interface SnapshotWire {
  tag: string;
  dir?: string;
}

/** Nodes that may hold `tag`: the directory's, then every other node (a tag it has not heard of yet). */
function snapshotNodes(context: GatewayContext, tag: string): string[] {
  const known = context.directory.snapshotPlaces(tag).map((p) => p.node);
  const cluster = context.view.snapshot(tag);
  const holders = cluster ? context.view.holders(cluster.digest) : [];
  const rest = context.placer.usable().map((n) => n.name);
  return [...new Set([...known, ...holders, ...rest])].filter((n) => context.links.client(n));
}

export function adminOnly(request: FastifyRequest, what: string): void {
  if (request.tenant !== null) throw new ForkdError("forbidden", `${what} is for admins`);
}

/** GET /v1/cluster: every node as the gateway sees it, its link, and the cluster's snapshots. */
export function clusterState(context: GatewayContext) {
  const links = new Map(context.links.states().map((l) => [l.node, l]));
  const schedulable = new Set(context.placer.usable().map((n) => n.name));
  return {
    version: FORKD_VERSION,
    api_server_read_at_unix_ms: context.view.lastRead,
    nodes: context.view.allNodes().map((n) => ({
      name: n.name,
      url: n.url,
      epoch: n.epoch,
      observed_epoch: n.observedEpoch,
      ready: n.ready,
      lease_held: n.leaseHeld,
      lost_since_unix_ms: n.lostSince,
      unschedulable: n.unschedulable,
      schedulable: schedulable.has(n.name),
      link: links.get(n.name) ?? null,
      sandboxes: context.directory.all().filter((p) => p.node === n.name).length,
      available: n.node.status?.available ?? null,
      snapshots: (n.node.status?.snapshots ?? []).map((s) => s.digest),
    })),
    snapshots: context.view.allSnapshots().map((s) => ({ ...s, holders: context.view.holders(s.digest) })),
  };
}

export type { SandboxRef };
