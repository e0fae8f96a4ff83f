/**
 * E2B's control plane where it concerns the cluster: create (placement: a template name is a ForkdSnapshot's
 * name or alias, E2B's default names mean the gateway's default snapshot), the lists (every node's, merged and
 * paged here with the same cursor a single daemon uses), templates and named snapshots (every node's). Every
 * /sandboxes/<id>/... call is relayed to the sandbox's node (server.ts), but for the pause under --durable-pause
 * (answered here: made durable, durable-pause.ts); E2B's fork stays on the source's node there, as on E2B.
 * Answers are the nodes' own E2B documents: nodes run with the gateway's --e2b-domain, so their `domain` fields
 * are right as they are.
 */
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply } from "fastify";
import { OptionalBody } from "../api/schemas.js";
import { ForkdError, notFound } from "../common/errors.js";
import { ListSandboxesQuery, NewSandbox, PauseBody } from "../e2b/control/schemas.js";
import { E2B_DEFAULT_TEMPLATES } from "../e2b/control/templates.js";
import { paginate } from "../e2b/control/wire.js";
import type { GatewayContext } from "./context.js";
import { pauseIsDurable, pauseThenMakeDurable } from "./durable-pause.js";
import { fanout } from "./fanout.js";
import type { SnapshotTarget } from "./placement.js";

const e2b = { config: { surface: "e2b" as const } };

interface ListedSandbox {
  sandboxID: string;
  startedAt: string;
  [field: string]: unknown;
}

/** Pages a node is asked for when the gateway merges lists (the most E2B's list route gives at once). */
const NODE_PAGE_LIMIT = 1000;
/** A node's pages followed at most (a node holds far fewer sandboxes than this times the page). */
const MAX_NODE_PAGES = 100;

export function registerE2bRoutes(app: FastifyInstance, context: GatewayContext): void {
  for (const url of ["/sandboxes", "/v2/sandboxes"]) {
    app.post<{ Body: Static<typeof NewSandbox> }>(
      url,
      { ...e2b, schema: { body: NewSandbox } },
      (request, reply) => createSandbox(context, url, request.body, request.tenant, reply),
    );
  }
  registerSandboxLists(app, context);
  registerTemplateRoutes(app, context);
  if (context.durablePause) registerDurablePauseRoute(app, context);
}

/**
 * E2B's pause under --durable-pause (server.ts relays it as it is otherwise): the node's own E2B pause (its
 * 409 for a paused sandbox, requireHealthyGuest, ...), then, when it keeps memory, made durable before the
 * 204 (durable-pause.ts). A filesystem-only pause (`memory: false`, the SDKs' keepMemory false) stays a pause on
 * its node: its disk is kept there only.
 */
function registerDurablePauseRoute(app: FastifyInstance, context: GatewayContext): void {
  app.post<{ Params: { sandboxID: string }; Body: Static<typeof PauseBody> | null | undefined }>(
    "/sandboxes/:sandboxID/pause",
    { ...e2b, schema: { body: OptionalBody(PauseBody) } },
    async (request, reply) => {
      const id = request.params.sandboxID;
      const placement = await context.locator.locate(id, request.tenant);
      // No body (the SDKs always send one) is the defaults: sent to the node as an empty one.
      const json = request.body ?? {};
      const call = { method: "POST" as const, path: `/sandboxes/${id}/pause`, json, deadlineMs: 0 };
      const pause = () => context.calls.send(placement.node, call, request.tenant);
      if (pauseIsDurable(context, undefined, request.body?.memory)) {
        await pauseThenMakeDurable(context, id, placement.node, pause);
      } else {
        await pause();
      }
      return reply.status(204).send();
    },
  );
}

/** The sandbox lists and metrics: every node's, merged (and paged, for v2) here. */
function registerSandboxLists(app: FastifyInstance, context: GatewayContext): void {
  app.get<{ Querystring: { metadata?: string } }>("/sandboxes", e2b, async (request, reply) => {
    const answers = await fanout<ListedSandbox[]>(
      context,
      { method: "GET", path: "/sandboxes", query: request.query },
      request.tenant,
      reply,
    );
    return answers.flatMap((a) => a.value);
  });

  app.get<{ Querystring: Static<typeof ListSandboxesQuery> }>(
    "/v2/sandboxes",
    { ...e2b, schema: { querystring: ListSandboxesQuery } },
    async (request, reply) => {
      const { limit, nextToken, ...filters } = request.query;
      const all = await listEverywhere(context, filters, request.tenant, reply);
      const key = (s: ListedSandbox) => `${String(Date.parse(s.startedAt)).padStart(15, "0")}:${s.sandboxID}`;
      all.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
      if (filters.order !== "asc") all.reverse();
      const sortKey = filters.order === "asc" ? key : (s: ListedSandbox) => invertKey(key(s));
      const page = paginate(all, sortKey, limit ?? 100, nextToken);
      if (page.nextToken !== undefined) reply.header("x-next-token", page.nextToken);
      reply.header("x-total-running", String(all.length));
      return page.items;
    },
  );

  app.get<{ Querystring: Record<string, string> }>("/sandboxes/metrics", e2b, async (request, reply) => {
    const answers = await fanout<Record<string, unknown>>(
      context,
      { method: "GET", path: "/sandboxes/metrics", query: request.query },
      request.tenant,
      reply,
    );
    const merged: Record<string, unknown> = {};
    for (const answer of answers) Object.assign(merged, answer.value.sandboxes ?? answer.value);
    return answers.some((a) => "sandboxes" in a.value) ? { sandboxes: merged } : merged;
  });
}

/** Templates, their aliases and named snapshots: the ForkdSnapshots' and every node's. */
function registerTemplateRoutes(app: FastifyInstance, context: GatewayContext): void {
  app.get("/templates", e2b, async (request, reply) => {
    const answers = await fanout<{ templateID: string }[]>(
      context,
      { method: "GET", path: "/templates" },
      request.tenant,
      reply,
    );
    const byId = new Map<string, { templateID: string }>();
    for (const answer of answers)
      for (const t of answer.value) if (!byId.has(t.templateID)) byId.set(t.templateID, t);
    return [...byId.values()];
  });

  app.get<{ Params: { alias: string } }>("/templates/aliases/:alias", e2b, async (request, reply) => {
    const alias = request.params.alias;
    const snapshot = context.view.snapshot(alias);
    if (snapshot) return { templateID: snapshot.name, public: false };
    const answers = await fanout<{ templateID: string; public: boolean } | null>(
      context,
      { method: "GET", path: `/templates/aliases/${encodeURIComponent(alias)}` },
      request.tenant,
      reply,
    );
    const found = answers.find((a) => a.value !== null);
    if (!found) throw notFound(`template ${JSON.stringify(alias)} not found`);
    return found.value;
  });

  app.get("/snapshots", e2b, async (request, reply) => {
    const answers = await fanout<unknown[]>(
      context,
      { method: "GET", path: "/snapshots", query: request.query as Record<string, string> },
      request.tenant,
      reply,
    );
    return answers.flatMap((a) => a.value);
  });
}

/** E2B create: the template placed as a spawn of one, the node's own E2B answer relayed. */
async function createSandbox(
  context: GatewayContext,
  url: string,
  body: Static<typeof NewSandbox>,
  tenant: string | null,
  reply: FastifyReply,
) {
  const { target, templateID } = await resolveTemplate(context, body.templateID, tenant);
  let status = 201;
  const [child] = await context.spawner.spawn(
    tenant,
    target,
    1,
    async (share) => {
      const answer = await context.calls.send(
        share.node,
        { method: "POST", path: url, json: { ...body, templateID }, deadlineMs: 0 },
        tenant,
      );
      status = answer.status;
      return JSON.parse(answer.body.toString("utf8")) as Record<string, unknown> & { sandboxID: string };
    },
    (answer) => [
      {
        id: answer.sandboxID,
        status: "running",
        owner: tenant,
        snapshot_tag: target.tag,
        created_at_unix: Math.floor(Date.now() / 1000),
      },
    ],
  );
  if (!child) throw new ForkdError("internal", "the spawn answered with no sandbox");
  reply.status(status);
  return child.value;
}

/**
 * What a create's templateID means in the cluster: a ForkdSnapshot (the node knows its aliases, set when it
 * pulled it), a node-local tag, or for E2B's default names the default snapshot (sent to the node by name).
 */
async function resolveTemplate(
  context: GatewayContext,
  name: string,
  tenant: string | null,
): Promise<{ target: SnapshotTarget; templateID: string }> {
  // E2B's default names are not asked of the nodes (every create would pay a round trip to each).
  const ask = !E2B_DEFAULT_TEMPLATES.has(name);
  try {
    return { target: await context.placer.resolve(name, tenant, { ask }), templateID: name };
  } catch (err) {
    if (!E2B_DEFAULT_TEMPLATES.has(name)) {
      if (err instanceof ForkdError && err.code === "not_found")
        throw notFound(`template ${JSON.stringify(name)} not found`);
      throw err;
    }
    const target = await context.placer.resolve(context.defaultSnapshot, tenant);
    return { target, templateID: target.tag };
  }
}

/** Every node's whole list (their pages followed), as E2B documents. */
async function listEverywhere(
  context: GatewayContext,
  filters: Record<string, unknown>,
  tenant: string | null,
  reply: FastifyReply,
): Promise<ListedSandbox[]> {
  const nodes = context.view.allNodes().filter((n) => n.leaseHeld && context.links.client(n.name));
  const unanswered: string[] = [];
  const lists = await Promise.all(
    nodes.map(async (node) => {
      const out: ListedSandbox[] = [];
      let token: string | undefined;
      try {
        for (let page = 0; page < MAX_NODE_PAGES; page++) {
          const answer = await context.calls.send(
            node.name,
            {
              method: "GET",
              path: "/v2/sandboxes",
              query: {
                ...(filters as Record<string, string>),
                limit: NODE_PAGE_LIMIT,
                ...(token ? { nextToken: token } : {}),
              },
            },
            tenant,
            AbortSignal.timeout(10_000),
          );
          out.push(...(JSON.parse(answer.body.toString("utf8")) as ListedSandbox[]));
          const next = answer.headers["x-next-token"];
          token = Array.isArray(next) ? next[0] : next;
          if (!token) break;
        }
      } catch {
        unanswered.push(node.name);
      }
      return out;
    }),
  );
  if (unanswered.length > 0) reply.header("x-forkd-unanswered-nodes", unanswered.join(","));
  return lists.flat();
}

function invertKey(key: string): string {
  return [...key].map((c) => String.fromCharCode(0xffff - c.charCodeAt(0))).join("");
}
