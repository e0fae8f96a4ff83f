/**
 * Packs through the API: `GET /v1/snapshots/:tag/pack` streams a pack of the chain (the daemon writes it under
 * FORKD_HOME/transfers first, then sends and removes it); `POST /v1/snapshots/unpack` receives one (streamed, bounded)
 * and installs it all or nothing. The format and every check are controller/snapshots/pack.ts' and
 * unpack.ts'. Registered in its own scope: the unpack body is raw bytes, read as a stream.
 */
import { createReadStream } from "node:fs";
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { ForkdError } from "../../common/errors.js";
import { PACK_CHAIN_HEADER, PACK_CONTENT_TYPE } from "../../common/limits.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import {
  BinaryBody,
  errorResponses,
  MAX_PACK_UPLOAD_BYTES,
  PackQuery,
  TagParams,
  UnpackQuery,
  UnpackResultWire,
} from "../schemas.js";

export function registerPackRoutes(scope: FastifyInstance): void {
  for (const type of [PACK_CONTENT_TYPE, "application/octet-stream"]) {
    scope.addContentTypeParser(type, (_request, payload, done) => done(null, payload));
  }

  scope.get<{ Params: Static<typeof TagParams>; Querystring: Static<typeof PackQuery> }>(
    "/v1/snapshots/:tag/pack",
    {
      schema: {
        tags: ["snapshots"],
        summary: "A pack (.tar.zst) of the snapshot's chain and, unless without_image, its guest image",
        description:
          "The same file `forkd pack` writes; `POST /v1/snapshots/unpack` (or `forkd unpack`) installs it on another " +
          "host or home. Headers X-Forkd-Pack-Chain (tags, root first) and Content-Length.",
        params: TagParams,
        querystring: PackQuery,
        response: { 200: BinaryBody, ...errorResponses },
      },
    },
    async (request, reply) => {
      const { result, file, dispose } = await servicesOf(request).snapshots.pack({
        tag: request.params.tag,
        withoutImage: request.query.without_image,
        level: request.query.level,
        signal: clientSignal(request, reply),
      });
      const stream = createReadStream(file);
      // Removed once sent, or once the client went away.
      reply.raw.once("close", () => void dispose());
      return reply
        .header("content-type", PACK_CONTENT_TYPE)
        .header("content-length", String(result.pack_bytes))
        .header("content-disposition", `attachment; filename="${request.params.tag}.tar.zst"`)
        .header(PACK_CHAIN_HEADER, result.chain.join(","))
        .send(stream);
    },
  );

  scope.post<{ Querystring: Static<typeof UnpackQuery>; Body: AsyncIterable<Buffer> }>(
    "/v1/snapshots/unpack",
    {
      bodyLimit: MAX_PACK_UPLOAD_BYTES,
      schema: {
        tags: ["snapshots"],
        summary:
          "Install a pack (the body, application/zstd): every entry and hash verified, all layers or none",
        description:
          `At most ${MAX_PACK_UPLOAD_BYTES} bytes. 201 with what was installed; 409 if a tag exists with other ` +
          "content (unless force) or a running sandbox uses a layer force would replace; 422 for a pack that fails " +
          "a check (naming the entry).",
        querystring: UnpackQuery,
        body: BinaryBody,
        response: { 201: UnpackResultWire, ...errorResponses },
      },
    },
    async (request, reply) => {
      const body: unknown = request.body;
      if (
        body !== undefined &&
        (body === null || typeof body !== "object" || !(Symbol.asyncIterator in body))
      ) {
        throw new ForkdError(
          "invalid_argument",
          `send the pack as ${PACK_CONTENT_TYPE} (or application/octet-stream), not ${request.headers["content-type"]}`,
        );
      }
      const installed = await servicesOf(request).snapshots.unpack({
        body: (body as AsyncIterable<Buffer> | undefined) ?? emptyBody(),
        maxBytes: MAX_PACK_UPLOAD_BYTES,
        tag: request.query.tag,
        force: request.query.force,
        signal: clientSignal(request, reply),
      });
      request.auditIds.push(...installed.installed, ...installed.replaced);
      return reply.status(201).send(installed);
    },
  );
}

async function* emptyBody(): AsyncGenerator<Buffer> {}
