/** /v1/snapshots: list, create from a template, inspect (with its chain), delete (cascade/force), compact. */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { invalidArgument } from "../../common/errors.js";
import type { SnapshotInfo } from "../../controller/sandbox-service.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import { notImplemented } from "../errors.js";
import {
  CompactSnapshotBody,
  CreateSnapshotBody,
  DeleteSnapshotQuery,
  errorResponses,
  SnapshotDetailWire,
  SnapshotInfoWire,
  TagParams,
} from "../schemas.js";
import { snapshotToWire } from "../wire.js";

type TagRoute = { Params: Static<typeof TagParams> };
type CreateRoute = { Body: CreateSnapshotBody };
type DeleteRoute = TagRoute & { Querystring: Static<typeof DeleteSnapshotQuery> };
type CompactRoute = TagRoute & { Body: CompactSnapshotBody };

export function registerSnapshotRoutes(app: FastifyInstance, context: ApiContext): void {
  const toWire = (info: SnapshotInfo) => snapshotToWire(info, context.snapshotsDir);
  app.get("/v1/snapshots", { schema: listSchema }, async (request) =>
    (await servicesOf(request).snapshots.list()).map(toWire),
  );
  app.post<CreateRoute>("/v1/snapshots", { schema: createSchema }, async (request, reply) =>
    reply.status(201).send(toWire(await createSnapshot(request, reply))),
  );
  app.get<TagRoute>("/v1/snapshots/:tag", { schema: getSchema }, async (request) =>
    toWire(await servicesOf(request).snapshots.get(request.params.tag)),
  );
  app.get<TagRoute>("/v1/snapshots/:tag/info", { schema: infoSchema }, async (request) => {
    const detail = await servicesOf(request).snapshots.detail(request.params.tag);
    return { ...detail, ...toWire(detail) };
  });
  app.delete<DeleteRoute>("/v1/snapshots/:tag", { schema: deleteSchema }, deleteSnapshot);
  app.post<CompactRoute>("/v1/snapshots/:tag/compact", { schema: compactSchema }, async (request, reply) =>
    // 200 like forkd v0.5 (its clients check for it), although a new snapshot is made.
    reply.status(200).send(toWire(await compactSnapshot(request, reply))),
  );
}

const listSchema = {
  tags: ["snapshots"],
  summary: "List snapshots",
  response: { 200: Type.Array(SnapshotInfoWire), ...errorResponses },
};

const createSchema = {
  tags: ["snapshots"],
  summary: "Create a snapshot from a template (build the image if needed, boot, warm, save)",
  description:
    "Blocks until the snapshot is ready (minutes under TCG for a cold image). 409 if the tag exists. " +
    "forkd v0.5's kernel/rootfs form is accepted when both name the files of one built forkd image in an " +
    "allowed image directory (400 otherwise, naming the directories); tap is 501.",
  body: CreateSnapshotBody,
  response: { 201: SnapshotInfoWire, ...errorResponses },
};

async function createSnapshot(
  request: FastifyRequest<CreateRoute>,
  reply: FastifyReply,
): Promise<SnapshotInfo> {
  const body = request.body;
  if ((body.tap ?? null) !== null) {
    throw notImplemented(
      "tap (a host tap device for the parent, forkd v0.5) is not supported: the daemon attaches every " +
        "NIC itself (a parent to a private namespace, each sandbox to its own); leave tap out",
    );
  }
  if ((body.kernel === undefined) !== (body.rootfs === undefined)) {
    throw invalidArgument("kernel and rootfs go together (forkd v0.5's form); or send a template instead");
  }
  const image =
    body.kernel !== undefined && body.rootfs !== undefined
      ? { kernel: body.kernel, rootfs: body.rootfs }
      : undefined;
  return servicesOf(request).snapshots.create({
    tag: body.tag,
    ...(image ? { image } : { template: body.template ?? body.tag }),
    signal: clientSignal(request, reply),
  });
}

const getSchema = {
  tags: ["snapshots"],
  summary: "One snapshot",
  params: TagParams,
  response: { 200: SnapshotInfoWire, ...errorResponses },
};

const infoSchema = {
  tags: ["snapshots"],
  summary: "A snapshot with its chain: ancestors, dependents, bytes per layer",
  params: TagParams,
  response: { 200: SnapshotDetailWire, ...errorResponses },
};

const deleteSchema = {
  tags: ["snapshots"],
  summary: "Delete a snapshot (cascade: with its dependents; force: orphaning them)",
  description:
    "404 if unknown; 409 if a running sandbox maps it or anything depending on it, or if other snapshots " +
    "depend on it and neither cascade nor force is set (the message and `dependents` name them).",
  params: TagParams,
  querystring: DeleteSnapshotQuery,
  response: { 204: Type.Null(), ...errorResponses },
};

async function deleteSnapshot(request: FastifyRequest<DeleteRoute>, reply: FastifyReply) {
  const deleted = await servicesOf(request).snapshots.delete(request.params.tag, {
    cascade: request.query.cascade,
    force: request.query.force,
  });
  request.auditIds.push(...deleted.filter((t) => t !== request.params.tag));
  return reply.status(204).send();
}

const compactSchema = {
  tags: ["snapshots"],
  summary: "Fold a snapshot chain into one new flat snapshot",
  description:
    "Writes `to`: no parent, memory = the chain's assembled RAM image, disk = one layer over the image's " +
    "root filesystem. Blocks until it is ready. 409 if `to` exists or is being written; 409/422 naming " +
    "the layer if the chain is broken or corrupted.",
  params: TagParams,
  body: CompactSnapshotBody,
  response: { 200: SnapshotInfoWire, ...errorResponses },
};

async function compactSnapshot(
  request: FastifyRequest<CompactRoute>,
  reply: FastifyReply,
): Promise<SnapshotInfo> {
  const compacted = await servicesOf(request).snapshots.compact({
    from: request.params.tag,
    to: request.body.to,
    signal: clientSignal(request, reply),
  });
  request.auditIds.push(compacted.tag);
  return compacted;
}
