/**
 * /v1/sandboxes: spawn, list, inspect, kill, lifetime, pause and resume, BRANCH and fork, the console log,
 * metrics. One named handler per route; each reaches the services as its caller's view (servicesOf). The buffered
 * guest calls (ping, exec, eval) are guest-calls.ts, registered here in their place among the sandbox routes.
 */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { invalidArgument } from "../../common/errors.js";
import { DEFAULT_BRANCH_MODE } from "../../controller/snapshots/branch.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import { notImplemented } from "../errors.js";
import {
  BranchBody,
  BranchResultWire,
  ConfinementStatusWire,
  ConsoleQuery,
  errorResponses,
  ForkBody,
  ForkResponse,
  KillManyQuery,
  KillManyResponse,
  ListSandboxesQuery,
  OptionalBody,
  PauseBody,
  PauseResponse,
  ResumeBody,
  SandboxInfoWire,
  SandboxMetricsWire,
  SandboxParams,
  SetTimeoutBody,
  SpawnBody,
} from "../schemas.js";
import { branchToWire, networkRequestFromWire, sandboxToWire } from "../wire.js";
import { registerGuestCallRoutes } from "./guest-calls.js";

type IdRoute = { Params: Static<typeof SandboxParams> };
type SpawnRoute = { Body: Static<typeof SpawnBody> };
type ListRoute = { Querystring: Static<typeof ListSandboxesQuery> };
type KillManyRoute = { Querystring: Static<typeof KillManyQuery> };
type TimeoutRoute = IdRoute & { Body: Static<typeof SetTimeoutBody> };
type PauseRoute = IdRoute & { Body: Static<typeof PauseBody> | undefined };
type ResumeRoute = IdRoute & { Body: Static<typeof ResumeBody> | undefined };
type BranchRoute = IdRoute & { Body: Static<typeof BranchBody> };
type ForkRoute = IdRoute & { Body: Static<typeof ForkBody> };
type ConsoleRoute = IdRoute & { Querystring: Static<typeof ConsoleQuery> };

export function registerSandboxRoutes(app: FastifyInstance, context: ApiContext): void {
  app.post<SpawnRoute>("/v1/sandboxes", { schema: spawnSchema }, spawnSandboxes);
  app.get<ListRoute>("/v1/sandboxes", { schema: listSchema }, listSandboxes);
  app.delete<KillManyRoute>("/v1/sandboxes", { schema: killManySchema }, killSandboxes);
  app.get<IdRoute>("/v1/sandboxes/:id", { schema: getSchema }, getSandbox);
  app.delete<IdRoute>("/v1/sandboxes/:id", { schema: killSchema }, killSandbox);
  app.post<TimeoutRoute>("/v1/sandboxes/:id/timeout", { schema: timeoutSchema }, setSandboxTimeout);
  app.post<PauseRoute>("/v1/sandboxes/:id/pause", { schema: pauseSchema }, pauseSandbox);
  app.post<ResumeRoute>("/v1/sandboxes/:id/resume", { schema: resumeSchema }, resumeSandbox);
  registerGuestCallRoutes(app, context);
  app.post<BranchRoute>("/v1/sandboxes/:id/branch", { schema: branchSchema }, (request, reply) =>
    branchSandbox(context, request, reply),
  );
  app.post<ForkRoute>("/v1/sandboxes/:id/fork", { schema: forkSchema }, forkSandbox);
  app.get<ConsoleRoute>("/v1/sandboxes/:id/console", { schema: consoleSchema }, sandboxConsole);
  app.get("/v1/confinement", { schema: confinementSchema }, async (request) =>
    servicesOf(request).sandboxes.confinementStatus(),
  );
  app.get<IdRoute>("/v1/sandboxes/:id/metrics", { schema: metricsSchema }, sandboxMetrics);
}

/** forkd v0.5 spawn flags whose feature forkd lacks: `true` is 501 naming it (false is accepted). */
const NOT_BUILT_SPAWN_FLAGS = {
  prewarm: "prewarm (faulting in guest pages after restore)",
  hugepages: "hugepages-backed guest RAM",
} as const;

const spawnSchema = {
  tags: ["sandboxes"],
  summary: "Fork n sandboxes from a snapshot",
  description:
    "All or nothing: 201 with n SandboxInfo once every child is ready. 404 unknown tag, 409 snapshot not " +
    "bootable, 429/503 when admission limits or host memory would be exceeded.",
  body: SpawnBody,
  response: { 201: Type.Array(SandboxInfoWire), ...errorResponses },
};

async function spawnSandboxes(request: FastifyRequest<SpawnRoute>, reply: FastifyReply) {
  const body = request.body;
  for (const [field, feature] of Object.entries(NOT_BUILT_SPAWN_FLAGS)) {
    if (body[field as keyof typeof NOT_BUILT_SPAWN_FLAGS] === true) {
      throw notImplemented(`${field}=true: ${feature} is not implemented in this forkd yet; send false`);
    }
  }
  const spawned = await servicesOf(request).sandboxes.spawn({
    snapshotTag: body.snapshot_tag,
    n: body.n ?? 1,
    memoryLimitMiB: body.memory_limit_mib ?? undefined,
    cpuLimitMillicores: body.cpu_limit_millicores,
    pidsLimit: body.pids_limit,
    diskLimitMiB: body.disk_limit_mib,
    timeoutMs: body.timeout_ms,
    liveFork: body.live_fork === true,
    metadata: body.metadata,
    env: body.env,
    network: networkRequestFromWire(body.network),
    ownNamespace: body.per_child_netns,
    ...(body.public_ports === false ? { inbound: { requireTrafficToken: true } } : {}),
    onTimeout: body.on_timeout,
    signal: clientSignal(request, reply),
  });
  request.auditIds.push(...spawned.map((sb) => sb.id));
  return reply.status(201).send(spawned.map(sandboxToWire));
}

const listSchema = {
  tags: ["sandboxes"],
  summary: "List sandboxes",
  querystring: ListSandboxesQuery,
  response: { 200: Type.Array(SandboxInfoWire), ...errorResponses },
};

async function listSandboxes(request: FastifyRequest<ListRoute>) {
  const { snapshot_tag: snapshotTag, status } = request.query;
  return servicesOf(request).sandboxes.list({ snapshotTag, status }).map(sandboxToWire);
}

const killManySchema = {
  tags: ["sandboxes"],
  summary: "Kill every sandbox (all=true) or every sandbox of one snapshot (snapshot_tag=T)",
  querystring: KillManyQuery,
  response: { 200: KillManyResponse, ...errorResponses },
};

async function killSandboxes(request: FastifyRequest<KillManyRoute>) {
  const { all, snapshot_tag: tag } = request.query;
  if (all === true && tag !== undefined) throw invalidArgument("give all=true or snapshot_tag, not both");
  if (all !== true && tag === undefined) {
    throw invalidArgument("refusing to kill without a filter: give all=true or snapshot_tag=<tag>");
  }
  const killed = await servicesOf(request).sandboxes.killAll(
    tag === undefined ? undefined : { snapshotTag: tag },
  );
  request.auditIds.push(...killed);
  return { killed };
}

const getSchema = {
  tags: ["sandboxes"],
  summary: "One sandbox",
  params: SandboxParams,
  response: { 200: SandboxInfoWire, ...errorResponses },
};

async function getSandbox(request: FastifyRequest<IdRoute>) {
  return sandboxToWire(servicesOf(request).sandboxes.get(request.params.id));
}

const killSchema = {
  tags: ["sandboxes"],
  summary: "Kill a sandbox",
  params: SandboxParams,
  response: { 204: Type.Null(), ...errorResponses },
};

async function killSandbox(request: FastifyRequest<IdRoute>, reply: FastifyReply) {
  await servicesOf(request).sandboxes.kill(request.params.id);
  return reply.status(204).send();
}

const timeoutSchema = {
  tags: ["sandboxes"],
  summary: "Set the remaining lifetime (0 = no limit)",
  params: SandboxParams,
  body: SetTimeoutBody,
  response: { 200: SandboxInfoWire, ...errorResponses },
};

async function setSandboxTimeout(request: FastifyRequest<TimeoutRoute>) {
  const { sandboxes } = servicesOf(request);
  return sandboxToWire(sandboxes.setTimeout(request.params.id, request.body.timeout_ms));
}

const pauseSchema = {
  tags: ["sandboxes"],
  summary: "Pause: the sandbox's state into a snapshot layer, its VM stopped, its RAM given back",
  description:
    "Its id, metadata, env, tokens, network and policy stay; it is listed with status paused and survives " +
    "daemon restarts and host reboots. Calls into it answer 409 until it is resumed. 409 if it is not " +
    "running (already paused included); 503 when the disk or host memory cannot take the capture.",
  params: SandboxParams,
  body: OptionalBody(PauseBody),
  response: { 200: PauseResponse, ...errorResponses },
};

async function pauseSandbox(request: FastifyRequest<PauseRoute>, reply: FastifyReply) {
  if (request.body?.durable === true) {
    throw invalidArgument("durable pauses are a cluster's: pause through the cluster's gateway");
  }
  const outcome = await servicesOf(request).sandboxes.pause(request.params.id, {
    merge: request.body?.merge === true ? "always" : "auto",
    memory: request.body?.memory,
    signal: clientSignal(request, reply),
  });
  request.auditIds.push(outcome.tag);
  return { ...outcome, sandbox: sandboxToWire(outcome.sandbox) };
}

const resumeSchema = {
  tags: ["sandboxes"],
  summary: "Resume a paused sandbox under the same id, where it was",
  description:
    "Processes, files and the interpreter continue; the guest gets the host's clock and fresh entropy; its " +
    "lifetime starts again (timeout_ms, else the one it had). 409 if it is not paused.",
  params: SandboxParams,
  body: OptionalBody(ResumeBody),
  response: { 200: SandboxInfoWire, ...errorResponses },
};

async function resumeSandbox(request: FastifyRequest<ResumeRoute>, reply: FastifyReply) {
  const resumed = await servicesOf(request).sandboxes.resume(request.params.id, {
    timeoutMs: request.body?.timeout_ms,
    signal: clientSignal(request, reply),
  });
  return sandboxToWire(resumed);
}

const branchSchema = {
  tags: ["sandboxes"],
  summary: "BRANCH: snapshot a running sandbox mid-work; it keeps running",
  description:
    "mode full (the default, as in forkd v0.5: a snapshot that stands alone, flat memory and one disk layer, " +
    "no parent), diff (only the pages and blocks the sandbox changed, on top of its base: a chain) or live " +
    "(like diff, memory captured while the guest runs; needs a sandbox spawned with live_fork). 201 with the " +
    "new snapshot and the pause it cost; 202 with status writing for live + wait:false. 409 if the tag exists " +
    "or is being written; 503 when the host-wide BRANCH limit (--branch-concurrency) is reached. Legacy v0.5 " +
    "forms: diff/live booleans, parent_tag (must name the source's base), measure_diff (adds diff_ms and " +
    "diff_*_bytes, which diff mode always reports).",
  params: SandboxParams,
  body: BranchBody,
  response: { 201: BranchResultWire, 202: BranchResultWire, ...errorResponses },
};

async function branchSandbox(context: ApiContext, request: FastifyRequest<BranchRoute>, reply: FastifyReply) {
  const body = request.body;
  // forkd v0.5: `mode` wins; without it the legacy booleans; without those a full branch.
  const mode = body.mode ?? (body.live ? "live" : body.diff ? "diff" : DEFAULT_BRANCH_MODE);
  if ((body.live && mode !== "live") || (body.diff && mode !== "diff")) {
    throw invalidArgument(`mode ${mode} contradicts the legacy ${body.live ? "live" : "diff"} flag`);
  }
  const outcome = await servicesOf(request).sandboxes.branch(request.params.id, {
    tag: body.tag,
    mode,
    wait: body.wait,
    parentTag: body.parent_tag,
    alias: body.alias,
    signal: clientSignal(request, reply),
  });
  request.auditIds.push(outcome.tag);
  return reply.status(outcome.status === "writing" ? 202 : 201).send(
    branchToWire(outcome, request.params.id, context.snapshotsDir, {
      measure: body.measure_diff === true || mode === "diff",
    }),
  );
}

const forkSchema = {
  tags: ["sandboxes"],
  summary: "Fork a sandbox: BRANCH it once, restore count children from the snapshot",
  description:
    "The source keeps running (paused briefly: live when it was spawned with live_fork, else diff); a " +
    "paused source stays paused and its children start from its paused state. Each " +
    "child succeeds or fails on its own: 201 with one entry per child. Children inherit the source's " +
    "metadata, env and egress policy (as it is now). The fork's snapshot is deleted once nothing uses it.",
  params: SandboxParams,
  body: ForkBody,
  response: { 201: ForkResponse, ...errorResponses },
};

async function forkSandbox(request: FastifyRequest<ForkRoute>, reply: FastifyReply) {
  const outcome = await servicesOf(request).sandboxes.fork(request.params.id, {
    count: request.body?.count ?? 1,
    timeoutMs: request.body?.timeout_ms,
    signal: clientSignal(request, reply),
  });
  request.auditIds.push(outcome.tag);
  for (const child of outcome.children) if (child.sandbox) request.auditIds.push(child.sandbox.id);
  return reply.status(201).send({
    snapshot_tag: outcome.tag,
    mode: outcome.mode,
    pause_ms: outcome.pause_ms,
    children: outcome.children.map((child) =>
      child.sandbox
        ? { sandbox: sandboxToWire(child.sandbox), error: null }
        : { sandbox: null, error: { error: child.error.message, code: child.error.code } },
    ),
  });
}

const consoleSchema = {
  tags: ["sandboxes"],
  summary: "The end of the sandbox's serial console",
  description:
    "The guest's serial output as the host kept it: a bounded log per sandbox (forkd daemon --console-log-kib, " +
    "4 MiB by default), older output dropped first; control characters removed. Kept across daemon restarts.",
  params: SandboxParams,
  querystring: ConsoleQuery,
  produces: ["text/plain"],
  response: { 200: { type: "string" }, ...errorResponses },
};

async function sandboxConsole(request: FastifyRequest<ConsoleRoute>, reply: FastifyReply) {
  const text = await servicesOf(request).sandboxes.console(request.params.id, request.query.bytes);
  return reply.type("text/plain; charset=utf-8").send(text);
}

const confinementSchema = {
  tags: ["sandboxes"],
  summary: "How this daemon confines its sandboxes (uids, seccomp, cgroups, disk and console bounds)",
  response: { 200: ConfinementStatusWire, ...errorResponses },
};

const metricsSchema = {
  tags: ["sandboxes"],
  summary: "What the sandbox uses now (CPU from the host, memory from the guest)",
  params: SandboxParams,
  response: { 200: SandboxMetricsWire, ...errorResponses },
};

async function sandboxMetrics(request: FastifyRequest<IdRoute>, reply: FastifyReply) {
  return servicesOf(request).sandboxes.metrics(request.params.id, { signal: clientSignal(request, reply) });
}
