/** /v1/snapshots: list, create from a template, inspect, delete. */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import type { SnapshotInfo } from "../../controller/sandbox-service.js";
import type { ApiContext } from "../app.js";
import { notImplemented } from "../errors.js";
import { clientSignal } from "../request-signal.js";
import {
  CreateSnapshotBody,
  DeleteSnapshotQuery,
  errorResponses,
  SnapshotDetailWire,
  SnapshotInfoWire,
  TagParams,
} from "../schemas.js";
import { snapshotToWire } from "../wire.js";

type TagRequest = { Params: Static<typeof TagParams> };

export function registerSnapshotRoutes(app: FastifyInstance, context: ApiContext): void {
  const { snapshots } = context.services;
  const toWire = (info: SnapshotInfo) => snapshotToWire(info, context.snapshotsDir);

  app.get(
    "/v1/snapshots",
    {
      schema: {
        tags: ["snapshots"],
        summary: "List snapshots",
        response: { 200: Type.Array(SnapshotInfoWire), ...errorResponses },
      },
    },
    async () => (await snapshots.list()).map(toWire),
  );

  app.post<{ Body: CreateSnapshotBody }>(
    "/v1/snapshots",
    {
      schema: {
        tags: ["snapshots"],
        summary: "Create a snapshot from a template (build the image if needed, boot, warm, save)",
        description:
          "Blocks until the snapshot is ready (minutes under TCG for a cold image). 409 if the tag exists. " +
          "forkd v0.5's raw kernel/rootfs form is answered 501.",
        body: CreateSnapshotBody,
        response: { 201: SnapshotInfoWire, ...errorResponses },
      },
    },
    async (request, reply) => {
      const body = request.body;
      if (body.kernel !== undefined || body.rootfs !== undefined || (body.tap ?? null) !== null) {
        throw notImplemented(
          "creating a snapshot from a raw kernel/rootfs/tap (forkd v0.5) is not supported: " +
            'send {"tag": ..., "template": ...} (see `forkd image ls` for templates)',
        );
      }
      const created = await snapshots.create({
        tag: body.tag,
        template: body.template ?? body.tag,
        signal: clientSignal(request, reply),
      });
      return reply.status(201).send(toWire(created));
    },
  );

  app.get<TagRequest>(
    "/v1/snapshots/:tag",
    {
      schema: {
        tags: ["snapshots"],
        summary: "One snapshot",
        params: TagParams,
        response: { 200: SnapshotInfoWire, ...errorResponses },
      },
    },
    async (request) => toWire(await snapshots.get(request.params.tag)),
  );

  app.get<TagRequest>(
    "/v1/snapshots/:tag/info",
    {
      schema: {
        tags: ["snapshots"],
        summary: "A snapshot with its chain: ancestors and dependents",
        params: TagParams,
        response: { 200: SnapshotDetailWire, ...errorResponses },
      },
    },
    async (request) => {
      const info = await snapshots.get(request.params.tag);
      const all = await snapshots.list();
      const byTag = new Map(all.map((s) => [s.tag, s]));
      const ancestors: string[] = [];
      const seen = new Set([info.tag]);
      for (let parent = info.parent_tag; parent !== null && !seen.has(parent); ) {
        ancestors.unshift(parent);
        seen.add(parent);
        parent = byTag.get(parent)?.parent_tag ?? null;
      }
      return {
        ...toWire(info),
        chain_depth: ancestors.length,
        ancestors,
        dependents: all.filter((s) => s.parent_tag === info.tag).map((s) => s.tag),
      };
    },
  );

  app.delete<TagRequest & { Querystring: Static<typeof DeleteSnapshotQuery> }>(
    "/v1/snapshots/:tag",
    {
      schema: {
        tags: ["snapshots"],
        summary: "Delete a snapshot",
        description: "404 if unknown; 409 if a running sandbox or a dependent snapshot still needs it.",
        params: TagParams,
        querystring: DeleteSnapshotQuery,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      if (request.query.cascade || request.query.force) {
        throw notImplemented("cascade/force deletes (forkd v0.5 snapshot chains) are not supported yet");
      }
      await snapshots.delete(request.params.tag);
      return reply.status(204).send();
    },
  );

  app.post<TagRequest>(
    "/v1/snapshots/:tag/compact",
    {
      schema: {
        tags: ["snapshots"],
        summary: "forkd v0.5 chain compaction: not implemented (501)",
        params: TagParams,
        response: errorResponses,
      },
    },
    async () => {
      throw notImplemented("snapshot compaction (forkd v0.5 diff chains) is not implemented");
    },
  );
}
