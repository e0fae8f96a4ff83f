/**
 * E2B's sandbox routes: create, list (paginated, metadata and state filters), get, kill, lifetimes, connect and
 * resume (a paused sandbox runs again), pause, metrics and the network update. Handlers translate to
 * SandboxService calls; the behaviour lives in the controller (network options: network.ts).
 */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { errorMessage, ForkdError, notFound } from "../../common/errors.js";
import { isValidSandboxId } from "../../common/names.js";
import type { SandboxInfo } from "../../controller/sandbox-service.js";
import type { Services } from "../../controller/tenancy/tenant-view.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { E2bContext } from "../context.js";
import { egressFromE2b, networkFromE2b } from "./network.js";
import {
  ConnectBody,
  DEFAULT_RESUME_TIMEOUT_SECONDS,
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
  ResumeBody,
  Sandbox,
  SandboxDetail,
  SandboxIdParams,
  SandboxMetric,
  TimeoutBody,
} from "./schemas.js";
import { resolveTemplateName } from "./templates.js";
import {
  detailToWire,
  type E2bState,
  e2bState,
  listedToWire,
  matchesMetadata,
  metricToWire,
  paginate,
  parseMetadataFilter,
  sandboxToWire,
} from "./wire.js";

type IdRoute = { Params: Static<typeof SandboxIdParams> };
type CreateRoute = { Body: Static<typeof NewSandbox> };
type ListRoute = { Querystring: Static<typeof ListSandboxesQuery> };
type ListV1Route = { Querystring: Static<typeof ListSandboxesV1Query> };
type TimeoutRoute = IdRoute & { Body: Static<typeof TimeoutBody> };
type RefreshRoute = IdRoute & { Body: Static<typeof RefreshBody> };
type ConnectRoute = IdRoute & { Body: Static<typeof ConnectBody> };
type PauseRoute = IdRoute & { Body: Static<typeof PauseBody> };
type ResumeRoute = IdRoute & { Body: Static<typeof ResumeBody> };
type NetworkRoute = IdRoute & { Body: Static<typeof NetworkUpdate> };
type MetricsRoute = IdRoute & { Querystring: Static<typeof MetricsQuery> };
type ManyMetricsRoute = { Querystring: Static<typeof ManyMetricsQuery> };

/** A sandbox that is running, by the id E2B names it with; anything else is E2B's 404. */
export function runningSandbox(services: Services, id: string): SandboxInfo {
  return sandboxIn(services, id, ["running"]);
}

/** A sandbox E2B lists (running or paused: `e2bState`); anything else is E2B's 404. */
export function knownSandbox(services: Services, id: string): SandboxInfo {
  return sandboxIn(services, id, ["running", "paused"]);
}

function sandboxIn(services: Services, id: string, states: readonly E2bState[]): SandboxInfo {
  if (!isValidSandboxId(id)) throw notFound(`sandbox ${JSON.stringify(id)} not found`);
  const info = services.sandboxes.get(id);
  const state = e2bState(info);
  if (state === null || !states.includes(state))
    throw notFound(`sandbox ${id} not found (it is ${info.status})`);
  return info;
}

const notBuilt = (message: string) => new ForkdError("not_implemented", message);

/** How long a pause with requireHealthyGuest waits for the guest agent's answer. */
const HEALTHY_GUEST_TIMEOUT_MS = 5000;

/** E2B's requireHealthyGuest: the sandbox's agent answers a ping, else 503 (ServiceBusyError) and no pause. */
async function requireAnsweringAgent(services: Services, id: string): Promise<void> {
  try {
    await services.sandboxes.ping(id, { signal: AbortSignal.timeout(HEALTHY_GUEST_TIMEOUT_MS) });
  } catch (err) {
    throw new ForkdError(
      "unavailable",
      `sandbox ${id}'s guest agent did not answer within ${HEALTHY_GUEST_TIMEOUT_MS} ms ` +
        `(${errorMessage(err)}): not paused (requireHealthyGuest)`,
    );
  }
}

/** Create-time options forkd cannot honour: refused by name instead of silently dropped. */
function refuseUnsupported(body: Static<typeof NewSandbox>): void {
  if (body.autoResume?.enabled === true && body.autoPause !== true) {
    throw new ForkdError(
      "invalid_argument",
      "autoResume needs autoPause: only a paused sandbox can be resumed",
    );
  }
  if (body.autoPauseMemory === false && body.autoResume?.enabled === true) {
    throw new ForkdError(
      "invalid_argument",
      "autoResume cannot be combined with autoPauseMemory false: a sandbox paused without memory resumes only " +
        "by an explicit connect (a cold boot)",
    );
  }
  if (body.mcp !== undefined && body.mcp !== null) {
    throw notBuilt("mcp: forkd templates have no MCP gateway; omit the mcp option");
  }
  if ((body.volumeMounts?.length ?? 0) > 0) throw notBuilt("volumeMounts: forkd has no volumes");
  if (body.iam !== undefined) throw notBuilt("iam: forkd has no workload identity tokens");
}

export function registerSandboxRoutes(app: FastifyInstance, context: E2bContext): void {
  for (const url of ["/v2/sandboxes", "/sandboxes"]) {
    app.post<CreateRoute>(url, { schema: createSchema(url) }, (request, reply) =>
      createSandbox(context, request, reply),
    );
  }
  app.get<ListRoute>("/v2/sandboxes", { schema: listSchema }, (request, reply) =>
    listSandboxes(context, request, reply),
  );
  app.get<ListV1Route>("/sandboxes", { schema: listV1Schema }, (request) => listRunning(context, request));
  app.get<IdRoute>("/sandboxes/:sandboxID", { schema: getSchema }, (request) => getSandbox(context, request));
  app.delete<IdRoute>("/sandboxes/:sandboxID", { schema: killSchema }, killSandbox);
  app.post<TimeoutRoute>("/sandboxes/:sandboxID/timeout", { schema: timeoutSchema }, setSandboxTimeout);
  app.post<RefreshRoute>("/sandboxes/:sandboxID/refreshes", { schema: refreshSchema }, refreshSandbox);
  for (const url of ["/v2/sandboxes/:sandboxID/connect", "/sandboxes/:sandboxID/connect"]) {
    app.post<ConnectRoute>(url, { schema: connectSchema }, (request, reply) =>
      connectSandbox(context, request, reply),
    );
  }
  app.post<PauseRoute>("/sandboxes/:sandboxID/pause", { schema: pauseSchema }, pauseSandbox);
  app.post<ResumeRoute>("/sandboxes/:sandboxID/resume", { schema: resumeSchema }, (request, reply) =>
    resumeSandbox(context, request, reply),
  );
  app.put<NetworkRoute>("/sandboxes/:sandboxID/network", { schema: networkSchema }, updateNetwork);
  app.get<MetricsRoute>("/sandboxes/:sandboxID/metrics", { schema: metricsSchema }, sandboxMetrics);
  app.get<ManyMetricsRoute>("/sandboxes/metrics", { schema: manyMetricsSchema }, manySandboxMetrics);
}

/** A sandbox as E2B's create, connect and resume answer it: with its access tokens (the caller's, by its view). */
function toSandbox(context: E2bContext, request: FastifyRequest, info: SandboxInfo): Static<typeof Sandbox> {
  return sandboxToWire(info, servicesOf(request).sandboxes.accessTokens(info.id), context.domain ?? null);
}

/** Resumes `id`; a resume another request already finished counts (two connects at once both succeed). */
async function resumeOrJoin(
  { sandboxes }: Services,
  id: string,
  request: { timeoutMs: number; memory: boolean | undefined; signal: AbortSignal },
): Promise<SandboxInfo> {
  try {
    return await sandboxes.resume(id, request);
  } catch (err) {
    if (err instanceof ForkdError && err.code === "conflict" && sandboxes.get(id).status === "running") {
      return sandboxes.extendTimeout(id, request.timeoutMs);
    }
    throw err;
  }
}

const createSchema = (url: string) => ({
  summary: url === "/sandboxes" ? "Create a sandbox (v1; `secure` is ignored)" : "Create a sandbox",
  description:
    "templateID is a template alias or snapshot tag; E2B's default names (base, code-interpreter-v1) " +
    "mean the daemon's default snapshot. Default timeout 300 s. allow_internet_access and network " +
    "(allowOut, denyOut, allowPublicTraffic, maskRequestHost, httpsPorts) as E2B defines them; without " +
    "either the daemon's --egress applies. autoPause: the end of the lifetime pauses it; autoResume: a " +
    "data-plane request resumes it; autoPauseMemory false: that pause keeps only the disk (filesystem-only, " +
    "resumed by a cold boot on connect, never auto-resumed; with autoResume it is 400). 404 unknown template; " +
    "501 for options forkd cannot honour (network.rules, network.egressProxy, mcp, volumeMounts, iam).",
  body: NewSandbox,
  response: { 201: Sandbox, ...errorResponses },
});

async function createSandbox(context: E2bContext, request: FastifyRequest<CreateRoute>, reply: FastifyReply) {
  const body = request.body;
  refuseUnsupported(body);
  const network = networkFromE2b(body.allow_internet_access, body.network, context.privateTraffic);
  const services = servicesOf(request);
  const template = await resolveTemplateName(services, body.templateID);
  const [info] = await services.sandboxes.spawn({
    snapshotTag: template.tag,
    n: 1,
    timeoutMs: (body.timeout ?? DEFAULT_TIMEOUT_SECONDS) * 1000,
    metadata: body.metadata,
    env: body.envVars,
    templateAlias: template.alias ?? undefined,
    onTimeout: body.autoPause === true ? "pause" : "kill",
    autoResume: body.autoResume?.enabled === true,
    autoPauseMemory: body.autoPause === true ? body.autoPauseMemory : undefined,
    network: network.egress,
    inbound: network.inbound,
    signal: clientSignal(request, reply),
  });
  const created = info as SandboxInfo;
  request.auditIds.push(created.id);
  return reply.status(201).send(toSandbox(context, request, created));
}

const listSchema = {
  summary: "List sandboxes (paginated)",
  description:
    "Filters: metadata, state (running, paused; both by default), startedAfter, template. " +
    "Newest first unless order=asc. X-Next-Token names the next page; X-Total-Running counts the matches.",
  querystring: ListSandboxesQuery,
  response: { 200: Type.Array(ListedSandbox), ...errorResponses },
};

async function listSandboxes(context: E2bContext, request: FastifyRequest<ListRoute>, reply: FastifyReply) {
  const query = request.query;
  const states = parseStates(query.state);
  const metadata = parseMetadataFilter(query.metadata);
  const startedAfter = parseDate(query.startedAfter);
  const services = servicesOf(request);
  const template = query.template ? await resolveTemplateName(services, query.template, false) : null;
  const matching = services.sandboxes
    .list()
    .filter((s) => {
      const state = e2bState(s);
      return state !== null && states.includes(state);
    })
    .filter((s) => matchesMetadata(s.metadata, metadata))
    .filter((s) => startedAfter === null || s.created_at_unix * 1000 >= startedAfter)
    .filter((s) => template === null || s.snapshot_tag === template.tag);
  const key = (s: SandboxInfo) => `${String(s.created_at_unix).padStart(12, "0")}:${s.id}`;
  matching.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  if (query.order !== "asc") matching.reverse();
  // Descending lists compare keys the other way round: invert them so the cursor logic stays ascending.
  const sortKey = query.order === "asc" ? key : (s: SandboxInfo) => invertKey(key(s));
  const page = paginate(matching, sortKey, query.limit ?? 100, query.nextToken);
  if (page.nextToken !== undefined) reply.header("x-next-token", page.nextToken);
  reply.header("x-total-running", String(matching.length));
  return Promise.all(
    page.items.map(async (s) => listedToWire(s, await context.facts.of(services.snapshots, s.snapshot_tag))),
  );
}

const listV1Schema = {
  summary: "List running sandboxes (v1, unpaginated)",
  querystring: ListSandboxesV1Query,
  response: { 200: Type.Array(ListedSandbox), ...errorResponses },
};

async function listRunning(context: E2bContext, request: FastifyRequest<ListV1Route>) {
  const metadata = parseMetadataFilter(request.query.metadata);
  const services = servicesOf(request);
  const running = services.sandboxes
    .list()
    .filter((s) => s.status === "running" && matchesMetadata(s.metadata, metadata));
  return Promise.all(
    running.map(async (s) => listedToWire(s, await context.facts.of(services.snapshots, s.snapshot_tag))),
  );
}

const getSchema = {
  summary: "One sandbox",
  params: SandboxIdParams,
  response: { 200: SandboxDetail, ...errorResponses },
};

async function getSandbox(context: E2bContext, request: FastifyRequest<IdRoute>) {
  const services = servicesOf(request);
  const info = knownSandbox(services, request.params.sandboxID);
  const facts = await context.facts.of(services.snapshots, info.snapshot_tag);
  return detailToWire(info, facts, services.sandboxes.accessTokens(info.id), context.domain ?? null);
}

const killSchema = {
  summary: "Kill a sandbox",
  params: SandboxIdParams,
  response: { 204: Type.Null(), ...errorResponses },
};

async function killSandbox(request: FastifyRequest<IdRoute>, reply: FastifyReply) {
  const id = request.params.sandboxID;
  if (!isValidSandboxId(id)) throw notFound(`sandbox ${JSON.stringify(id)} not found`);
  await servicesOf(request).sandboxes.kill(id);
  return reply.status(204).send();
}

const timeoutSchema = {
  summary: "Set the remaining lifetime (seconds from now; may shorten it)",
  params: SandboxIdParams,
  body: TimeoutBody,
  response: { 204: Type.Null(), ...errorResponses },
};

async function setSandboxTimeout(request: FastifyRequest<TimeoutRoute>, reply: FastifyReply) {
  const services = servicesOf(request);
  runningSandbox(services, request.params.sandboxID);
  services.sandboxes.setTimeout(request.params.sandboxID, request.body.timeout * 1000);
  return reply.status(204).send();
}

const refreshSchema = {
  summary: "Keep the sandbox alive at least `duration` seconds more (never shortens)",
  params: SandboxIdParams,
  body: OptionalBody(RefreshBody),
  response: { 204: Type.Null(), ...errorResponses },
};

async function refreshSandbox(request: FastifyRequest<RefreshRoute>, reply: FastifyReply) {
  const services = servicesOf(request);
  runningSandbox(services, request.params.sandboxID);
  const seconds = request.body?.duration ?? DEFAULT_TIMEOUT_SECONDS;
  services.sandboxes.extendTimeout(request.params.sandboxID, seconds * 1000);
  return reply.status(204).send();
}

const connectSchema = {
  summary:
    "Connect to a sandbox: a paused one is resumed (201), a running one gets its lifetime extended (200)",
  description:
    "Its access tokens either way. Default timeout 300 s: a resumed sandbox lives that long from now, a " +
    "running one at least that long (never shortened). A sandbox paused with memory: false resumes by a cold " +
    "boot (its disk, id and tokens; no processes); memory: false on one paused with memory is 501, true on one " +
    "paused without it 400.",
  params: SandboxIdParams,
  body: OptionalBody(ConnectBody),
  response: { 200: Sandbox, 201: Sandbox, ...errorResponses },
};

async function connectSandbox(
  context: E2bContext,
  request: FastifyRequest<ConnectRoute>,
  reply: FastifyReply,
) {
  const id = request.params.sandboxID;
  const services = servicesOf(request);
  const info = knownSandbox(services, id);
  const seconds = request.body?.timeout ?? DEFAULT_TIMEOUT_SECONDS;
  if (e2bState(info) === "paused") {
    const resumed = await resumeOrJoin(services, id, {
      timeoutMs: seconds * 1000,
      memory: request.body?.memory,
      signal: clientSignal(request, reply),
    });
    return reply.status(201).send(toSandbox(context, request, resumed));
  }
  return reply
    .status(200)
    .send(toSandbox(context, request, services.sandboxes.extendTimeout(id, seconds * 1000)));
}

const pauseSchema = {
  summary: "Pause: the sandbox's memory, processes and files saved, its VM stopped; connect resumes it",
  description:
    "204 once it is paused; 409 if it already is (the SDK's pause() then returns false). memory: false: a " +
    "filesystem-only pause (the guest's disk synced and kept, its processes and memory not; connect cold-boots " +
    "it). A sandbox that was cold-booted so can be paused again only with memory: false (else 501).",
  params: SandboxIdParams,
  body: OptionalBody(PauseBody),
  response: { 204: Type.Null(), ...errorResponses },
};

async function pauseSandbox(request: FastifyRequest<PauseRoute>, reply: FastifyReply) {
  const id = request.params.sandboxID;
  const services = servicesOf(request);
  const info = knownSandbox(services, id);
  if (e2bState(info) === "paused") throw new ForkdError("conflict", `sandbox ${id} is already paused`);
  const memory = request.body?.memory;
  if (info.cold_booted && memory !== false) {
    throw notBuilt(
      `sandbox ${id} was resumed by a cold boot from a filesystem-only pause: forkd cannot pause it with its ` +
        "memory (it is no snapshot's); pause it with memory: false",
    );
  }
  if (request.body?.requireHealthyGuest === true) await requireAnsweringAgent(services, id);
  await services.sandboxes.pause(id, { memory, signal: clientSignal(request, reply) });
  return reply.status(204).send();
}

const resumeSchema = {
  summary: "Resume a paused sandbox (v1; connect is the current form); a running one answers 409",
  description: "timeout (seconds) defaults to 15, as E2B declares it for this route.",
  params: SandboxIdParams,
  body: OptionalBody(ResumeBody),
  response: { 201: Sandbox, ...errorResponses },
};

async function resumeSandbox(context: E2bContext, request: FastifyRequest<ResumeRoute>, reply: FastifyReply) {
  const id = request.params.sandboxID;
  const services = servicesOf(request);
  const info = knownSandbox(services, id);
  if (e2bState(info) === "running") throw new ForkdError("conflict", `sandbox ${id} is already running`);
  const seconds = request.body?.timeout ?? DEFAULT_RESUME_TIMEOUT_SECONDS;
  const resumed = await resumeOrJoin(services, id, {
    timeoutMs: seconds * 1000,
    memory: request.body?.memory,
    signal: clientSignal(request, reply),
  });
  return reply.status(201).send(toSandbox(context, request, resumed));
}

const networkSchema = {
  summary: "Replace a running sandbox's egress configuration",
  description:
    "allow_internet_access, allowOut, denyOut as at create; a field left out is cleared, and an empty " +
    "body gives the sandbox the daemon's default egress. Takes effect at once, for established " +
    "connections too. 409 for a sandbox without a network of its own.",
  params: SandboxIdParams,
  body: OptionalBody(NetworkUpdate),
  response: { 204: Type.Null(), ...errorResponses },
};

async function updateNetwork(request: FastifyRequest<NetworkRoute>, reply: FastifyReply) {
  const services = servicesOf(request);
  runningSandbox(services, request.params.sandboxID);
  const egress = egressFromE2b(request.body ?? {});
  await services.sandboxes.setNetworkPolicy(request.params.sandboxID, egress ?? {});
  return reply.status(204).send();
}

const metricsSchema = {
  summary:
    "The sandbox's metrics since it started (a sample every --metrics-interval-s, bounded and coarser as " +
    "it ages), in [start, end] (unix seconds) when given",
  params: SandboxIdParams,
  querystring: MetricsQuery,
  response: { 200: Type.Array(SandboxMetric), ...errorResponses },
};

async function sandboxMetrics(request: FastifyRequest<MetricsRoute>, reply: FastifyReply) {
  const services = servicesOf(request);
  runningSandbox(services, request.params.sandboxID);
  const { start, end } = request.query;
  // Whole seconds on the wire: the JS SDK rounds a Date to the nearest second, the Python SDK truncates it, so
  // the window takes in every millisecond either could have meant (a sample read back as `start` is in it).
  const samples = await services.sandboxes.metricsHistory(request.params.sandboxID, {
    ...(start === undefined ? {} : { startMs: start * 1000 - 500 }),
    ...(end === undefined ? {} : { endMs: end * 1000 + 999 }),
    signal: clientSignal(request, reply),
  });
  return samples.map(metricToWire);
}

const manyMetricsSchema = {
  summary: "The latest sample of several sandboxes",
  querystring: ManyMetricsQuery,
  response: { 200: ManyMetrics, ...errorResponses },
};

async function manySandboxMetrics(request: FastifyRequest<ManyMetricsRoute>, reply: FastifyReply) {
  const raw = request.query.sandbox_ids;
  const ids = (Array.isArray(raw) ? raw : raw.split(",")).map((id) => id.trim()).filter(Boolean);
  const signal = clientSignal(request, reply);
  const services = servicesOf(request);
  const out: Record<string, Static<typeof SandboxMetric>> = {};
  for (const id of ids) {
    const info = (() => {
      try {
        return runningSandbox(services, id);
      } catch {
        return null;
      }
    })();
    const latest = info && (await services.sandboxes.metricsHistory(id, { signal })).at(-1);
    if (latest) out[id] = metricToWire(latest);
  }
  return { sandboxes: out };
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
