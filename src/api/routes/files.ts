/**
 * Files inside a sandbox: raw bytes in and out (application/octet-stream, binary-safe), listings and stat as JSON.
 * Registered in its own scope because it parses every request body as bytes, whatever its content type.
 */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import {
  BinaryBody,
  errorResponses,
  FileInfoWire,
  FileListingWire,
  FileQuery,
  MAX_FILE_TRANSFER_BYTES,
  PutFileQuery,
  PutFileResponse,
  RemoveFileQuery,
  SandboxParams,
} from "../schemas.js";
import { fileInfoToWire } from "../wire.js";

type IdParams = Static<typeof SandboxParams>;
type PutRoute = { Params: IdParams; Querystring: Static<typeof PutFileQuery>; Body: Buffer | undefined };
type PathRoute = { Params: IdParams; Querystring: Static<typeof FileQuery> };
type RemoveRoute = { Params: IdParams; Querystring: Static<typeof RemoveFileQuery> };

export function registerFileRoutes(scope: FastifyInstance): void {
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser(
    "*",
    { parseAs: "buffer", bodyLimit: MAX_FILE_TRANSFER_BYTES },
    (_req, body, done) => done(null, body),
  );
  scope.put<PutRoute>(
    "/v1/sandboxes/:id/files",
    { bodyLimit: MAX_FILE_TRANSFER_BYTES, schema: writeSchema },
    writeFile,
  );
  scope.get<PathRoute>("/v1/sandboxes/:id/files", { schema: readSchema }, readFile);
  scope.delete<RemoveRoute>("/v1/sandboxes/:id/files", { schema: removeSchema }, removeFile);
  scope.get<PathRoute>("/v1/sandboxes/:id/files/list", { schema: listSchema }, listFiles);
  scope.get<PathRoute>("/v1/sandboxes/:id/files/stat", { schema: statSchema }, async (request, reply) =>
    fileInfoToWire(
      await servicesOf(request).sandboxes.files.stat(request.params.id, guestPath(request.query.path), {
        signal: clientSignal(request, reply),
      }),
    ),
  );
}

const writeSchema = {
  tags: ["files"],
  summary: "Write a file (atomically replaced; parent directories created)",
  description: `The body is the file's bytes, at most ${MAX_FILE_TRANSFER_BYTES} (413 beyond).`,
  params: SandboxParams,
  querystring: PutFileQuery,
  body: BinaryBody,
  consumes: ["application/octet-stream"],
  response: { 200: PutFileResponse, ...errorResponses },
};

async function writeFile(request: FastifyRequest<PutRoute>, reply: FastifyReply) {
  const target = guestPath(request.query.path);
  const data = request.body ?? Buffer.alloc(0);
  const mode = request.query.mode === undefined ? undefined : Number.parseInt(request.query.mode, 8);
  const written = await servicesOf(request).sandboxes.files.write(request.params.id, target, data, {
    mode,
    signal: clientSignal(request, reply),
  });
  return { path: target, bytes: written.bytes };
}

const readSchema = {
  tags: ["files"],
  summary: "Read a file",
  description: `Answers the file's bytes; 413 if it is larger than ${MAX_FILE_TRANSFER_BYTES} bytes.`,
  params: SandboxParams,
  querystring: FileQuery,
  produces: ["application/octet-stream"],
  response: { 200: BinaryBody, ...errorResponses },
};

async function readFile(request: FastifyRequest<PathRoute>, reply: FastifyReply) {
  const target = guestPath(request.query.path);
  const content = await servicesOf(request).sandboxes.files.read(request.params.id, target, {
    maxBytes: MAX_FILE_TRANSFER_BYTES,
    signal: clientSignal(request, reply),
  });
  if (content.truncated) {
    throw new ForkdError(
      "payload_too_large",
      `${target} is larger than ${MAX_FILE_TRANSFER_BYTES} bytes, the most one files request transfers: ` +
        "read it in parts with exec (e.g. split/dd) instead",
    );
  }
  return reply
    .type("application/octet-stream")
    .header("x-forkd-file-size", String(content.size))
    .send(content.data);
}

const removeSchema = {
  tags: ["files"],
  summary: "Remove a file, or a directory (recursive=true unless empty)",
  params: SandboxParams,
  querystring: RemoveFileQuery,
  response: { 204: Type.Null(), ...errorResponses },
};

async function removeFile(request: FastifyRequest<RemoveRoute>, reply: FastifyReply) {
  const target = guestPath(request.query.path);
  if (target === "/") throw invalidArgument('refusing to remove "/"');
  await servicesOf(request).sandboxes.files.remove(request.params.id, target, {
    recursive: request.query.recursive === true,
    signal: clientSignal(request, reply),
  });
  return reply.status(204).send();
}

const listSchema = {
  tags: ["files"],
  summary: "List a directory",
  params: SandboxParams,
  querystring: FileQuery,
  response: { 200: FileListingWire, ...errorResponses },
};

async function listFiles(request: FastifyRequest<PathRoute>, reply: FastifyReply) {
  const target = guestPath(request.query.path);
  const listing = await servicesOf(request).sandboxes.files.list(request.params.id, target, {
    signal: clientSignal(request, reply),
  });
  return { path: target, entries: listing.entries.map(fileInfoToWire), truncated: listing.truncated };
}

const statSchema = {
  tags: ["files"],
  summary: "Describe a path (not following a final symlink)",
  params: SandboxParams,
  querystring: FileQuery,
  response: { 200: FileInfoWire, ...errorResponses },
};

/**
 * Guest paths are absolute and plain: no NUL, no "." or ".." segments. Inside the VM a ".." could not escape
 * anything, but a path that means something other than what it spells is a mistake worth refusing.
 */
export function guestPath(raw: string): string {
  const bad = (why: string) =>
    new ForkdError("invalid_argument", `invalid query parameter "path" ${JSON.stringify(raw)}: ${why}`);
  if (raw.includes("\0")) throw bad("contains a NUL byte");
  if (!raw.startsWith("/")) throw bad("must be absolute (start with /)");
  const segments = raw.split("/");
  if (segments.some((s) => s === "." || s === "..")) throw bad("must not contain '.' or '..' segments");
  const normalized = `/${segments.filter((s) => s !== "").join("/")}`;
  return normalized;
}
