/**
 * E2B's sandbox routes: create, list (paginated, metadata and state filters), get, kill, lifetimes, connect,
 * metrics, the network update, and the pause/resume routes whose features forkd does not have yet (a clear
 * error, never a fake success). Handlers translate to SandboxService calls; the behaviour lives in the
 * controller (network options: network.ts).
 */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { responseGoneSignal } from "../../common/client-signal.js";
import { ForkdError, notFound } from "../../common/errors.js";
import { isValidSandboxId } from "../../common/names.js";
import type { SandboxInfo } from "../../controller/sandbox-service.js";
import type { E2bContext } from "../context.js";
import { egressFromE2b, networkFromE2b } from "./network.js";
import {
  ConnectBody,
  DEFAULT_TIMEOUT_SECONDS,
  errorResponses,
  ListedSandbox,
  ListSandboxesQuery,
  ListSandboxesV1Query,
  ManyMetrics,
  ManyMetricsQuery,
  MetricsQuery,
  NetworkUpdate,
  NewSandbox,
  OptionalBody,
  PauseBody,
  RefreshBody,
  Sandbox,
  SandboxDetail,
  SandboxIdParams,
  SandboxMetric,
  TimeoutBody,
} from "./schemas.js";
import { resolveTemplateName } from "./templates.js";
import {
  detailToWire,
  listedToWire,
  matchesMetadata,
  metricToWire,
  paginate,
  parseMetadataFilter,
  sandboxToWire,
} from "./wire.js";

type IdRequest = { Params: Static<typeof SandboxIdParams> };

/** A sandbox that is running, by the id E2B names it with; anything else is E2B's 404. */
export function runningSandbox(context: E2bContext, id: string): SandboxInfo {
  if (!isValidSandboxId(id)) throw notFound(`sandbox ${JSON.stringify(id)} not found`);
  const info = context.services.sandboxes.get(id);
  if (info.status !== "running") throw notFound(`sandbox ${id} not found (it is ${info.status})`);
  return info;
}

export function clientSignal(request: FastifyRequest, reply: FastifyReply): AbortSignal {
  return responseGoneSignal(reply.raw, `request ${request.id}`);
}

const notBuilt = (message: string) => new ForkdError("not_implemented", message);

/** Create-time options forkd cannot honour: refused by name instead of silently dropped. */
function refuseUnsupported(body: Static<typeof NewSandbox>): void {
  if (body.autoPause === true || body.autoResume?.enabled === true) {
    throw notBuilt(
      "autoPause/autoResume: pausing sandboxes is not supported by this forkd yet (the pause/resume issue); " +
        "create without lifecycle.onTimeout='pause'",
    );
  }
  if (body.mcp !== undefined && body.mcp !== null) {
    throw notBuilt("mcp: forkd templates have no MCP gateway; omit the mcp option");
  }
  if ((body.volumeMounts?.length ?? 0) > 0) throw notBuilt("volumeMounts: forkd has no volumes");
  if (body.iam !== undefined) throw notBuilt("iam: forkd has no workload identity tokens");
}

export function registerSandboxRoutes(app: FastifyInstance, context: E2bContext): void {
  const { sandboxes } = context.services;
  const domain = context.domain ?? null;
  const toSandbox = (info: SandboxInfo) => sandboxToWire(info, sandboxes.accessTokens(info.id), domain);

  const create = async (
    request: FastifyRequest<{ Body: Static<typeof NewSandbox> }>,
    reply: FastifyReply,
  ): Promise<FastifyReply> => {
    const body = request.body;
    refuseUnsupported(body);
    const network = networkFromE2b(body.allow_internet_access, body.network, context.privateTraffic);
    const template = await resolveTemplateName(context, body.templateID);
    const [info] = await sandboxes.spawn({
      snapshotTag: template.tag,
      n: 1,
      timeoutMs: (body.timeout ?? DEFAULT_TIMEOUT_SECONDS) * 1000,
      metadata: body.metadata,
      env: body.envVars,
      templateAlias: template.alias ?? undefined,
      network: network.egress,
      inbound: network.inbound,
      signal: clientSignal(request, reply),
    });
    const created = info as SandboxInfo;
    request.auditIds.push(created.id);
    return reply.status(201).send(toSandbox(created));
  };
  for (const url of ["/v2/sandboxes", "/sandboxes"]) {
    app.post(
      url,
      {
        schema: {
          summary: url === "/sandboxes" ? "Create a sandbox (v1; `secure` is ignored)" : "Create a sandbox",
          description:
            "templateID is a template alias or snapshot tag; E2B's default names (base, code-interpreter-v1) " +
            "mean the daemon's default snapshot. Default timeout 300 s. allow_internet_access and network " +
            "(allowOut, denyOut, allowPublicTraffic, maskRequestHost, httpsPorts) as E2B defines them; without " +
            "either the daemon's --egress applies. 404 unknown template; 501 for options forkd cannot honour " +
            "(autoPause, network.rules, network.egressProxy, mcp, volumeMounts, iam).",
          body: NewSandbox,
          response: { 201: Sandbox, ...errorResponses },
        },
      },
      create,
    );
  }

  app.get<{ Querystring: Static<typeof ListSandboxesQuery> }>(
    "/v2/sandboxes",
    {
      schema: {
        summary: "List sandboxes (paginated)",
        description:
          "Filters: metadata, state (running; forkd has no paused sandboxes yet), startedAfter, template. " +
          "Newest first unless order=asc. X-Next-Token names the next page; X-Total-Running counts the matches.",
        querystring: ListSandboxesQuery,
        response: { 200: Type.Array(ListedSandbox), ...errorResponses },
      },
    },
    async (request, reply) => {
      const query = request.query;
      const states = parseStates(query.state);
      const metadata = parseMetadataFilter(query.metadata);
      const startedAfter = parseDate(query.startedAfter);
      const template = query.template ? await resolveTemplateName(context, query.template, false) : null;
      const matching = states.includes("running")
        ? sandboxes
            .list()
            .filter((s) => s.status === "running")
            .filter((s) => matchesMetadata(s.metadata, metadata))
            .filter((s) => startedAfter === null || s.created_at_unix * 1000 >= startedAfter)
            .filter((s) => template === null || s.snapshot_tag === template.tag)
        : [];
      const key = (s: SandboxInfo) => `${String(s.created_at_unix).padStart(12, "0")}:${s.id}`;
      matching.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
      if (query.order !== "asc") matching.reverse();
      // Descending lists compare keys the other way round: invert them so the cursor logic stays ascending.
      const sortKey = query.order === "asc" ? key : (s: SandboxInfo) => invertKey(key(s));
      const page = paginate(matching, sortKey, query.limit ?? 100, query.nextToken);
      if (page.nextToken !== undefined) reply.header("x-next-token", page.nextToken);
      reply.header("x-total-running", String(matching.length));
      return Promise.all(
        page.items.map(async (s) => listedToWire(s, await context.facts.of(s.snapshot_tag))),
      );
    },
  );

  app.get<{ Querystring: Static<typeof ListSandboxesV1Query> }>(
    "/sandboxes",
    {
      schema: {
        summary: "List running sandboxes (v1, unpaginated)",
        querystring: ListSandboxesV1Query,
        response: { 200: Type.Array(ListedSandbox), ...errorResponses },
      },
    },
    async (request) => {
      const metadata = parseMetadataFilter(request.query.metadata);
      const running = sandboxes
        .list()
        .filter((s) => s.status === "running" && matchesMetadata(s.metadata, metadata));
      return Promise.all(running.map(async (s) => listedToWire(s, await context.facts.of(s.snapshot_tag))));
    },
  );

  app.get<IdRequest>(
    "/sandboxes/:sandboxID",
    {
      schema: {
        summary: "One sandbox",
        params: SandboxIdParams,
        response: { 200: SandboxDetail, ...errorResponses },
      },
    },
    async (request) => {
      const info = runningSandbox(context, request.params.sandboxID);
      const facts = await context.facts.of(info.snapshot_tag);
      return detailToWire(info, facts, sandboxes.accessTokens(info.id), domain);
    },
  );

  app.delete<IdRequest>(
    "/sandboxes/:sandboxID",
    {
      schema: {
        summary: "Kill a sandbox",
        params: SandboxIdParams,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      const id = request.params.sandboxID;
      if (!isValidSandboxId(id)) throw notFound(`sandbox ${JSON.stringify(id)} not found`);
      await sandboxes.kill(id);
      return reply.status(204).send();
    },
  );

  app.post<IdRequest & { Body: Static<typeof TimeoutBody> }>(
    "/sandboxes/:sandboxID/timeout",
    {
      schema: {
        summary: "Set the remaining lifetime (seconds from now; may shorten it)",
        params: SandboxIdParams,
        body: TimeoutBody,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      runningSandbox(context, request.params.sandboxID);
      sandboxes.setTimeout(request.params.sandboxID, request.body.timeout * 1000);
      return reply.status(204).send();
    },
  );

  app.post<IdRequest & { Body: Static<typeof RefreshBody> }>(
    "/sandboxes/:sandboxID/refreshes",
    {
      schema: {
        summary: "Keep the sandbox alive at least `duration` seconds more (never shortens)",
        params: SandboxIdParams,
        body: OptionalBody(RefreshBody),
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      runningSandbox(context, request.params.sandboxID);
      const seconds = request.body?.duration ?? DEFAULT_TIMEOUT_SECONDS;
      sandboxes.extendTimeout(request.params.sandboxID, seconds * 1000);
      return reply.status(204).send();
    },
  );

  for (const url of ["/v2/sandboxes/:sandboxID/connect", "/sandboxes/:sandboxID/connect"]) {
    app.post<IdRequest & { Body: Static<typeof ConnectBody> }>(
      url,
      {
        schema: {
          summary:
            "Connect to a running sandbox: its access tokens, and its lifetime extended (never shortened)",
          description:
            "Default timeout 300 s. Paused sandboxes do not exist yet, so 200 (already running) or 404.",
          params: SandboxIdParams,
          body: OptionalBody(ConnectBody),
          response: { 200: Sandbox, ...errorResponses },
        },
      },
      async (request) => {
        runningSandbox(context, request.params.sandboxID);
        const seconds = request.body?.timeout ?? DEFAULT_TIMEOUT_SECONDS;
        return toSandbox(sandboxes.extendTimeout(request.params.sandboxID, seconds * 1000));
      },
    );
  }

  app.post<IdRequest & { Body: Static<typeof PauseBody> }>(
    "/sandboxes/:sandboxID/pause",
    {
      schema: {
        summary: "Pause: not supported yet (501)",
        params: SandboxIdParams,
        body: OptionalBody(PauseBody),
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request) => {
      runningSandbox(context, request.params.sandboxID);
      throw notBuilt(
        "pausing sandboxes is not supported by this forkd yet (the pause/resume issue); the sandbox keeps running",
      );
    },
  );

  app.post<IdRequest>(
    "/sandboxes/:sandboxID/resume",
    {
      schema: {
        summary: "Resume (v1): a running sandbox answers 409, as E2B's does",
        params: SandboxIdParams,
        response: { 201: Sandbox, ...errorResponses },
      },
    },
    async (request) => {
      runningSandbox(context, request.params.sandboxID);
      throw new ForkdError("conflict", `sandbox ${request.params.sandboxID} is already running`);
    },
  );

  app.put<IdRequest & { Body: Static<typeof NetworkUpdate> }>(
    "/sandboxes/:sandboxID/network",
    {
      schema: {
        summary: "Replace a running sandbox's egress configuration",
        description:
          "allow_internet_access, allowOut, denyOut as at create; a field left out is cleared, and an empty " +
          "body gives the sandbox the daemon's default egress. Takes effect at once, for established " +
          "connections too. 409 for a sandbox without a network of its own.",
        params: SandboxIdParams,
        body: OptionalBody(NetworkUpdate),
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      runningSandbox(context, request.params.sandboxID);
      const egress = egressFromE2b(request.body ?? {});
      await sandboxes.setNetworkPolicy(request.params.sandboxID, egress ?? {});
      return reply.status(204).send();
    },
  );

  app.get<IdRequest & { Querystring: Static<typeof MetricsQuery> }>(
    "/sandboxes/:sandboxID/metrics",
    {
      schema: {
        summary: "What the sandbox uses now (one sample: forkd keeps no history)",
        params: SandboxIdParams,
        querystring: MetricsQuery,
        response: { 200: Type.Array(SandboxMetric), ...errorResponses },
      },
    },
    async (request, reply) => {
      runningSandbox(context, request.params.sandboxID);
      const sample = await sandboxes.metrics(request.params.sandboxID, {
        signal: clientSignal(request, reply),
      });
      return [metricToWire(sample)];
    },
  );

  app.get<{ Querystring: Static<typeof ManyMetricsQuery> }>(
    "/sandboxes/metrics",
    {
      schema: {
        summary: "The latest sample of several sandboxes",
        querystring: ManyMetricsQuery,
        response: { 200: ManyMetrics, ...errorResponses },
      },
    },
    async (request, reply) => {
      const raw = request.query.sandbox_ids;
      const ids = (Array.isArray(raw) ? raw : raw.split(",")).map((id) => id.trim()).filter(Boolean);
      const signal = clientSignal(request, reply);
      const out: Record<string, Static<typeof SandboxMetric>> = {};
      for (const id of ids) {
        const info = (() => {
          try {
            return runningSandbox(context, id);
          } catch {
            return null;
          }
        })();
        if (info) out[id] = metricToWire(await sandboxes.metrics(id, { signal }));
      }
      return { sandboxes: out };
    },
  );
}

function parseStates(state: string | string[] | undefined): string[] {
  if (state === undefined) return ["running", "paused"];
  const values = (Array.isArray(state) ? state : [state]).flatMap((s) => s.split(",")).map((s) => s.trim());
  for (const value of values) {
    if (value !== "running" && value !== "paused") {
      throw new ForkdError("invalid_argument", `invalid state ${JSON.stringify(value)}: running or paused`);
    }
  }
  return values;
}

function parseDate(value: string | undefined): number | null {
  if (value === undefined) return null;
  const ms = Date.parse(value);
  if (Number.isNaN(ms)) {
    throw new ForkdError(
      "invalid_argument",
      `invalid startedAfter ${JSON.stringify(value)}: not a date-time`,
    );
  }
  return ms;
}

/** A key that sorts the other way round (digits and hex only, so each character maps to its complement). */
function invertKey(key: string): string {
  return [...key].map((c) => String.fromCharCode(0xffff - c.charCodeAt(0))).join("");
}
