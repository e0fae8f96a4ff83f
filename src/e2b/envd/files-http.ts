/**
 * envd's file transfer routes: `GET /files` streams a file out of the sandbox, `POST /files` writes one
 * (application/octet-stream, optionally gzip) or many (multipart/form-data, each part's filename its path).
 * Both move data through the agent in bounded chunks, so neither side buffers a whole file; an upload goes to
 * a temporary name beside its target and is renamed into place only when complete, and removed when it fails.
 * Access: the sandbox's X-Access-Token, or a signature made from it (the SDK's uploadUrl/downloadUrl); a signed
 * URL that names no sandbox (built on E2B_SANDBOX_URL) reaches the sandbox whose token signed it.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import path from "node:path";
import { Readable } from "node:stream";
import { createGunzip, createGzip } from "node:zlib";
import multipart from "@fastify/multipart";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import type { SandboxService } from "../../controller/sandbox-service.js";
import { servicesOf } from "../../http/request-scope.js";
import type { E2bContext } from "../context.js";
import { hasAccessToken, resolveSignedSandbox, type SandboxSession } from "../session.js";
import type { GuestUser } from "./guest-users.js";
import { checkRequestedPath, resolveGuestPath } from "./paths.js";
import { uploadTemporary } from "./upload-names.js";
import { DEFAULT_USER } from "./version.js";

/** Bytes written to the guest per agent call. */
export const WRITE_CHUNK_BYTES = 4 * 1024 * 1024;
/**
 * Bytes read from the guest per agent call. Smaller than a write: the kernel refuses one read() of 4 MiB or more
 * from /proc/sys files (ENOMEM), and a file read is a single read() in the guest.
 */
export const READ_CHUNK_BYTES = 1024 * 1024;
/** Largest upload one request may carry (all its files together) unless configured; beyond it, 413. */
export const MAX_UPLOAD_BYTES = 1024 * 1024 * 1024;
/** Files one multipart request may carry. */
export const MAX_UPLOAD_FILES = 1000;

interface FilesQuery {
  path?: string;
  username?: string;
  signature?: string;
  signature_expiration?: string;
}

function payloadTooLarge(limit: number): ForkdError {
  return new ForkdError("payload_too_large", `upload is larger than ${limit} bytes (this daemon's limit)`);
}

/** E2B's URL signature: v1_ + base64(sha256("path:operation:user:token[:expiration]")) without padding. */
export function fileSignature(
  filePath: string,
  operation: "read" | "write",
  user: string,
  token: string,
  expiration: number | undefined,
): string {
  const parts = [filePath, operation, user, token, ...(expiration === undefined ? [] : [String(expiration)])];
  return `v1_${createHash("sha256").update(parts.join(":")).digest("base64").replace(/=+$/, "")}`;
}

/** The request may touch files: it carries the sandbox's access token, or a valid, unexpired signature. */
function authorizeFiles(
  request: FastifyRequest<{ Querystring: FilesQuery }>,
  context: E2bContext,
  session: SandboxSession,
  operation: "read" | "write",
): void {
  if (hasAccessToken(request, context, session, ["envd"])) return;
  if (request.headers["x-access-token"] !== undefined) {
    throw new ForkdError("unauthorized", "access token present in header but does not match");
  }
  const { signature, signature_expiration: exp, path: filePath = "", username = "" } = request.query;
  if (signature === undefined) {
    throw new ForkdError(
      "unauthorized",
      "send X-Access-Token, or use a signed URL (signature query parameter)",
    );
  }
  const expiration = signatureExpiration(exp);
  const token = servicesOf(request).sandboxes.accessTokens(session.sandboxId).envd;
  const expected = Buffer.from(fileSignature(filePath, operation, username, token, expiration));
  const presented = Buffer.from(signature);
  if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) {
    throw new ForkdError("unauthorized", "invalid signature");
  }
  if (expiration !== undefined && expiration < Date.now() / 1000) {
    throw new ForkdError("unauthorized", "signature is already expired");
  }
}

/**
 * The running sandbox a signed URL was made for, when the URL reaches the daemon without naming one: the SDKs
 * build `uploadUrl`/`downloadUrl` on E2B_SANDBOX_URL, which carries no sandbox id (E2B routes them by host
 * name). The sandbox whose envd token verifies the signature is the one meant (session.ts); the request then
 * acts within that sandbox alone, as one carrying its id and token does. authorizeFiles still checks the
 * signature's expiration.
 */
export function resolveSignedFiles(
  request: FastifyRequest<{ Querystring: FilesQuery }>,
  context: E2bContext,
): SandboxSession {
  const { signature, signature_expiration: exp, path: filePath = "", username = "" } = request.query;
  if (typeof signature !== "string") {
    throw new ForkdError(
      "unauthorized",
      "no sandbox named: send E2b-Sandbox-Id with X-Access-Token, or use a signed URL (signature query parameter)",
    );
  }
  const expiration = signatureExpiration(exp);
  const operation = request.method === "GET" ? "read" : "write";
  const session = resolveSignedSandbox(request, context, signature, (token) =>
    fileSignature(filePath, operation, username, token, expiration),
  );
  if (session === undefined) throw new ForkdError("unauthorized", "invalid signature");
  return session;
}

function signatureExpiration(exp: string | undefined): number | undefined {
  const expiration = exp === undefined ? undefined : Number(exp);
  if (expiration !== undefined && !Number.isInteger(expiration)) {
    throw invalidArgument("signature_expiration must be a unix time in seconds");
  }
  return expiration;
}

/** A sandbox's files, as the caller's view of the services (that one sandbox) reaches them. */
type SandboxFiles = SandboxService["files"];

async function fileUser(
  context: E2bContext,
  files: SandboxFiles,
  session: SandboxSession,
  name: string | undefined,
) {
  const user = name === undefined || name === "" ? DEFAULT_USER : name;
  return context.users.lookup(files, session.sandboxId, user);
}

export async function registerFileRoutes(scope: FastifyInstance, context: E2bContext): Promise<void> {
  const maxUploadBytes = context.maxUploadBytes ?? MAX_UPLOAD_BYTES;
  await scope.register(multipart, {
    preservePath: true,
    // One byte over the limit reaches the handler, which refuses the file before it is put in place.
    limits: { fileSize: maxUploadBytes + 1, files: MAX_UPLOAD_FILES, parts: MAX_UPLOAD_FILES * 2 },
    throwFileSizeLimit: true,
  });
  // Raw uploads arrive as a stream; the handler moves it to the guest chunk by chunk.
  scope.addContentTypeParser("application/octet-stream", (_request, payload, done) => done(null, payload));

  scope.get<{ Querystring: FilesQuery }>("/files", async (request, reply) => {
    const session = request.e2bSandbox as SandboxSession;
    authorizeFiles(request, context, session, "read");
    checkRequestedPath(request.query.path);
    const { files } = servicesOf(request).sandboxes;
    const user = await fileUser(context, files, session, request.query.username);
    const filePath = resolveGuestPath(request.query.path, user);
    const info = await files.stat(session.sandboxId, filePath).catch((err: unknown) => {
      if (err instanceof ForkdError && err.code === "not_found") {
        throw new ForkdError("not_found", `path '${filePath}' does not exist`);
      }
      throw err;
    });
    if (info.type === "dir") throw invalidArgument(`path '${filePath}' is a directory`);
    const first = await files.read(session.sandboxId, filePath, { maxBytes: READ_CHUNK_BYTES });
    reply.header("vary", "Accept-Encoding").type("application/octet-stream");
    const gzip = /\bgzip\b/i.test(String(request.headers["accept-encoding"] ?? ""));
    if (!first.truncated && !gzip) {
      return reply.header("content-length", first.data.length).send(first.data);
    }
    const chunks = Readable.from(readChunks(files, session.sandboxId, filePath, first.data, first.truncated));
    if (!gzip) return reply.send(chunks);
    return reply.header("content-encoding", "gzip").send(chunks.pipe(createGzip()));
  });

  scope.post<{ Querystring: FilesQuery }>("/files", async (request, reply) => {
    const session = request.e2bSandbox as SandboxSession;
    authorizeFiles(request, context, session, "write");
    if (Object.keys(request.headers).some((h) => h.toLowerCase().startsWith("x-metadata-"))) {
      throw invalidArgument("file metadata (X-Metadata-* headers) is not supported by forkd");
    }
    checkRequestedPath(request.query.path);
    const { files } = servicesOf(request).sandboxes;
    const user = await fileUser(context, files, session, request.query.username);
    const upload = new Upload(files, session.sandboxId, user, maxUploadBytes);
    const encoding = String(request.headers["content-encoding"] ?? "identity").toLowerCase();
    if (encoding !== "identity" && encoding !== "gzip") {
      throw invalidArgument(`unsupported Content-Encoding ${JSON.stringify(encoding)}: identity or gzip`);
    }
    try {
      if (request.isMultipart()) {
        if (encoding !== "identity") throw invalidArgument("gzip is supported for octet-stream uploads only");
        for await (const part of request.parts()) {
          if (part.type !== "file" || part.fieldname !== "file") continue;
          await upload.file(request.query.path ?? part.filename, part.file);
        }
      } else if (request.body instanceof Readable) {
        if (request.query.path === undefined) {
          throw invalidArgument("path query parameter is required for raw body upload");
        }
        const body = encoding === "gzip" ? request.body.pipe(createGunzip()) : request.body;
        await upload.file(request.query.path, body);
      } else {
        throw invalidArgument(
          `unsupported content type ${JSON.stringify(request.headers["content-type"] ?? "")}: ` +
            "expected multipart/form-data or application/octet-stream",
        );
      }
    } catch (err) {
      await upload.abandon();
      // The rest of the body may be unread: the connection cannot carry another request, and says so.
      reply.header("connection", "close");
      throw translateMultipartError(err, maxUploadBytes);
    }
    return reply.send(upload.written);
  });
}

/** Chunks of a file from the guest, after the first (already read); stops at the end the agent reports. */
async function* readChunks(
  files: SandboxFiles,
  id: string,
  filePath: string,
  first: Buffer,
  more: boolean,
): AsyncGenerator<Buffer> {
  yield first;
  let offset = first.length;
  let truncated = more;
  while (truncated) {
    const chunk = await files.read(id, filePath, {
      offset,
      maxBytes: READ_CHUNK_BYTES,
    });
    if (chunk.data.length === 0) return;
    offset += chunk.data.length;
    truncated = chunk.truncated;
    yield chunk.data;
  }
}

/** One request's uploads: each file to a temporary name, renamed into place when whole. */
class Upload {
  readonly written: { path: string; name: string; type: "file" }[] = [];
  private readonly temporaries = new Set<string>();
  private total = 0;

  constructor(
    private readonly files: SandboxFiles,
    private readonly id: string,
    private readonly user: GuestUser,
    private readonly maxBytes: number,
  ) {}

  async file(requestedPath: string, stream: Readable): Promise<void> {
    const files = this.files;
    const target = resolveGuestPath(requestedPath, this.user);
    if (this.written.some((w) => w.path === target)) {
      throw invalidArgument(`you cannot upload multiple files to the same path '${target}' in one request`);
    }
    const existing = await files.stat(this.id, target).catch(() => null);
    if (existing?.type === "dir") throw invalidArgument(`path is a directory: ${target}`);
    const temporary = uploadTemporary(target);
    const options = { user: this.user.name, mode: 0o644, parents: true };
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    let started = false;
    const flush = async () => {
      const data = Buffer.concat(pending, pendingBytes);
      pending = [];
      pendingBytes = 0;
      this.temporaries.add(temporary);
      // Appending from the first chunk on: the temporary is a fresh random name, so the agent's own atomic
      // write (another temporary, renamed over this one) would only add names that watchers then see.
      await files.write(this.id, temporary, data, { ...options, append: true });
      started = true;
    };
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      this.total += chunk.length;
      if (this.total > this.maxBytes) throw payloadTooLarge(this.maxBytes);
      pending.push(chunk);
      pendingBytes += chunk.length;
      if (pendingBytes >= WRITE_CHUNK_BYTES) await flush();
    }
    // A stream the multipart parser cut at its limit ends normally: it must not be taken for the whole file.
    if ((stream as { truncated?: boolean }).truncated) throw payloadTooLarge(this.maxBytes);
    if (pendingBytes > 0 || !started) await flush();
    await files.move(this.id, temporary, target, { user: this.user.name });
    this.temporaries.delete(temporary);
    this.written.push({ path: target, name: path.posix.basename(target), type: "file" });
  }

  /** A failed request leaves no half-written temporary behind (files already in place stay, as in envd). */
  async abandon(): Promise<void> {
    const files = this.files;
    await Promise.all([...this.temporaries].map((t) => files.remove(this.id, t).catch(() => {})));
    this.temporaries.clear();
  }
}

function translateMultipartError(err: unknown, limit: number): unknown {
  const code = (err as { code?: unknown }).code;
  if (code === "FST_REQ_FILE_TOO_LARGE") return payloadTooLarge(limit);
  if (code === "FST_FILES_LIMIT" || code === "FST_PARTS_LIMIT") {
    return new ForkdError("payload_too_large", `at most ${MAX_UPLOAD_FILES} files per upload`);
  }
  if (code === "FST_INVALID_MULTIPART_CONTENT_TYPE") return invalidArgument("malformed multipart body");
  if (err instanceof Error && /Unexpected end of (form|multipart)/i.test(err.message)) {
    return invalidArgument(`malformed multipart body: ${err.message}`);
  }
  return err;
}
