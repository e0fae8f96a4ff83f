/**
 * Files for COPY steps, as E2B's SDKs upload them: GET /templates/{templateID}/files/{hash} says whether the
 * caller already has an archive under that hash and, if not, gives a URL to PUT it to; the PUT (which carries
 * no API key: E2B's URL points at object storage) is this daemon's own route, authenticated by the URL's
 * signature (HMAC with a key of this process, bound to the template, the hash, the tenant and an expiry).
 * The archive is the tenant's, whichever template it was uploaded for.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { Readable } from "node:stream";
import { type Static, Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { ForkdError } from "../../common/errors.js";
import { ADMIN } from "../../controller/tenancy/tenant-view.js";
import { servicesOf } from "../../http/request-scope.js";
import { errorResponses } from "../control/schemas.js";
import { FilesParams, FileUploadLink, UploadQuery } from "./schemas.js";
import { buildsOf } from "./wire.js";

/** How long an upload URL stays good. */
const UPLOAD_URL_TTL_S = 3600;
/** Signs this process's upload URLs (a restart invalidates them; the SDK asks for a fresh one per build). */
const SIGNING_KEY = randomBytes(32);

declare module "fastify" {
  interface FastifyContextConfig {
    /** Authenticated by its signed URL, not an API key (the E2B control plane's key check skips it). */
    e2bSignedUpload?: boolean;
  }
}

function signature(templateId: string, hash: string, owner: string, expires: number): string {
  return createHmac("sha256", SIGNING_KEY)
    .update(`${templateId}\n${hash}\n${owner}\n${expires}`)
    .digest("hex");
}

function uploadUrl(request: FastifyRequest, templateId: string, hash: string): string {
  const owner = request.principal?.tenant ?? "";
  const expires = Math.floor(Date.now() / 1000) + UPLOAD_URL_TTL_S;
  const query = new URLSearchParams({
    owner,
    expires: String(expires),
    signature: signature(templateId, hash, owner, expires),
  });
  return `${request.protocol}://${request.host}/templates/${encodeURIComponent(templateId)}/files/${hash}?${query}`;
}

function checkSignature(params: Static<typeof FilesParams>, query: Static<typeof UploadQuery>): void {
  const expected = Buffer.from(signature(params.templateID, params.hash, query.owner, query.expires), "hex");
  const given = Buffer.from(query.signature, "hex");
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
    throw new ForkdError("forbidden", "the upload URL's signature does not match");
  }
  if (query.expires < Date.now() / 1000) throw new ForkdError("forbidden", "the upload URL has expired");
}

export async function registerFileRoutes(app: FastifyInstance): Promise<void> {
  app.get<{ Params: Static<typeof FilesParams> }>(
    "/templates/:templateID/files/:hash",
    {
      schema: {
        summary: "Whether the files of a COPY step are uploaded; where to upload them if not",
        params: FilesParams,
        response: { 201: FileUploadLink, ...errorResponses },
      },
    },
    async (request, reply) => {
      const builds = buildsOf(servicesOf(request));
      const template = await builds.get(request.params.templateID);
      const present = await builds.hasFiles(request.params.hash);
      return reply
        .status(201)
        .send(present ? { present } : { present, url: uploadUrl(request, template.id, request.params.hash) });
    },
  );

  // The archive itself: any body type, streamed to the store (bounded there), never parsed here.
  await app.register(async (uploads) => {
    uploads.removeAllContentTypeParsers();
    uploads.addContentTypeParser("*", (_request, payload, done) => done(null, payload));
    uploads.put<{ Params: Static<typeof FilesParams>; Querystring: Static<typeof UploadQuery> }>(
      "/templates/:templateID/files/:hash",
      {
        config: { e2bSignedUpload: true },
        schema: {
          summary: "Upload a COPY step's archive (a tar, optionally gzip'd) to the URL the link route gave",
          description:
            "Signed URL, no API key. Size-bounded; every entry must be a file, directory or symlink inside the archive.",
          params: FilesParams,
          querystring: UploadQuery,
          response: { 204: Type.Null(), ...errorResponses },
        },
      },
      async (request, reply) => {
        checkSignature(request.params, request.query);
        request.principal = request.query.owner === "" ? ADMIN : { tenant: request.query.owner };
        request.caller = "e2b:signed-upload";
        await buildsOf(servicesOf(request)).putFiles(request.params.hash, request.body as Readable);
        return reply.status(204).send();
      },
    );
  });
}
