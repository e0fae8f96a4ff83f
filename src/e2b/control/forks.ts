/**
 * E2B's fork and snapshot routes over forkd's BRANCH. A fork BRANCHes the running source once (it keeps
 * running) and restores `count` children from that snapshot, one result entry each; a snapshot is a BRANCH kept
 * under a name (a template alias), usable as templateID.
 */
import { randomBytes } from "node:crypto";
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ForkdError } from "../../common/errors.js";
import type { SnapshotInfo as ForkdSnapshot } from "../../controller/sandbox-service.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { E2bContext } from "../context.js";
import { knownSandbox } from "./sandboxes.js";
import {
  DEFAULT_FORK_TIMEOUT_SECONDS,
  DEFAULT_PAGE_LIMIT,
  type ErrorBody,
  errorResponses,
  ForkBody,
  ForkResult,
  ListSnapshotsQuery,
  OptionalBody,
  SandboxIdParams,
  SnapshotInfo,
  SnapshotRequest,
} from "./schemas.js";
import { paginate, sandboxToWire } from "./wire.js";

type IdRoute = { Params: Static<typeof SandboxIdParams> };
type ForkRoute = IdRoute & { Body: Static<typeof ForkBody> };
type SnapshotRoute = IdRoute & { Body: Static<typeof SnapshotRequest> };
type ListSnapshotsRoute = { Querystring: Static<typeof ListSnapshotsQuery> };

export function registerForkRoutes(app: FastifyInstance, context: E2bContext): void {
  app.post<ForkRoute>("/sandboxes/:sandboxID/fork", { schema: forkSchema }, (request, reply) =>
    forkSandbox(context, request, reply),
  );
  app.post<SnapshotRoute>("/sandboxes/:sandboxID/snapshots", { schema: snapshotSchema }, snapshotSandbox);
  app.get<ListSnapshotsRoute>("/snapshots", { schema: listSnapshotsSchema }, listSnapshots);
}

const forkSchema = {
  summary: "Fork a running sandbox: one BRANCH, count children",
  description:
    "The source is paused briefly (live BRANCH when it was spawned with live_fork, else diff) and keeps its " +
    "id and lifetime. 201 with one entry per fork, each its sandbox or its error. Default count 1, default " +
    `timeout ${DEFAULT_FORK_TIMEOUT_SECONDS} s (E2B's declared default). Children inherit metadata, envVars and the source's network configuration.`,
  params: SandboxIdParams,
  body: OptionalBody(ForkBody),
  response: { 201: Type.Array(ForkResult), ...errorResponses },
};

async function forkSandbox(context: E2bContext, request: FastifyRequest<ForkRoute>, reply: FastifyReply) {
  const services = servicesOf(request);
  // A paused source forks from its paused state and stays paused.
  const source = knownSandbox(services, request.params.sandboxID);
  const outcome = await services.sandboxes.fork(source.id, {
    count: request.body?.count ?? 1,
    timeoutMs: (request.body?.timeout ?? DEFAULT_FORK_TIMEOUT_SECONDS) * 1000,
    signal: clientSignal(request, reply),
  });
  const results = outcome.children.map((child): Static<typeof ForkResult> => {
    if (child.sandbox) {
      request.auditIds.push(child.sandbox.id);
      const tokens = services.sandboxes.accessTokens(child.sandbox.id);
      return { sandbox: sandboxToWire(child.sandbox, tokens, context.domain ?? null) };
    }
    const error: Static<typeof ErrorBody> = { code: child.error.httpStatus, message: child.error.message };
    return { error };
  });
  return reply.status(201).send(results);
}

const snapshotSchema = {
  summary: "Snapshot a sandbox (a running one keeps running); the snapshot is usable as templateID",
  description:
    "A BRANCH kept under `name` (a template alias) or, without one, under its own tag. Naming a snapshot " +
    "again moves the name to the new one; the old one is deleted once nothing uses it.",
  params: SandboxIdParams,
  body: OptionalBody(SnapshotRequest),
  response: { 201: SnapshotInfo, ...errorResponses },
};

async function snapshotSandbox(request: FastifyRequest<SnapshotRoute>, reply: FastifyReply) {
  const services = servicesOf(request);
  const source = knownSandbox(services, request.params.sandboxID);
  if (request.body?.memory === false) {
    throw new ForkdError(
      "not_implemented",
      "a snapshot with memory: false (filesystem only) is not supported by forkd: its snapshots keep the " +
        "whole sandbox, memory included; omit memory or send true",
    );
  }
  const outcome = await services.sandboxes.branch(source.id, {
    tag: `snap-${randomBytes(6).toString("hex")}`,
    mode: source.live_fork && source.status === "running" ? "live" : "diff",
    alias: request.body?.name,
    signal: clientSignal(request, reply),
  });
  request.auditIds.push(outcome.tag);
  return reply.status(201).send(snapshotToWire(outcome.snapshot));
}

const listSnapshotsSchema = {
  summary: "Snapshots taken of sandboxes (paginated; filter by sandboxID or name)",
  querystring: ListSnapshotsQuery,
  response: { 200: Type.Array(SnapshotInfo), ...errorResponses },
};

async function listSnapshots(request: FastifyRequest<ListSnapshotsRoute>, reply: FastifyReply) {
  const { sandboxID, name, limit, nextToken } = request.query;
  const taken = (await servicesOf(request).snapshots.list())
    .filter((s) => s.status === "ready" && s.source_sandbox !== null && !s.ephemeral)
    .filter((s) => sandboxID === undefined || s.source_sandbox === sandboxID)
    .filter((s) => name === undefined || s.tag === name || s.aliases.includes(name));
  const page = paginate(taken, (s) => s.tag, limit ?? DEFAULT_PAGE_LIMIT, nextToken);
  if (page.nextToken !== undefined) reply.header("x-next-token", page.nextToken);
  return page.items.map(snapshotToWire);
}

function snapshotToWire(s: ForkdSnapshot): Static<typeof SnapshotInfo> {
  const names = s.aliases.length > 0 ? s.aliases : [s.tag];
  return { snapshotID: names[0] as string, names };
}
