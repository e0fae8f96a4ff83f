/**
 * Streaming exec: `POST /v1/sandboxes/:id/exec/stream` answers `application/x-ndjson`, one event per line, written
 * as the process produces output: `started`, then `stdout`/`stderr` chunks, then `exit` (or `error`). Stdin is
 * either inline (a JSON request body) or streamed: with `Content-Type: application/x-ndjson` the first request line
 * is the exec request and each following line a stdin frame; the end of the request body closes stdin. If the client
 * disconnects, the process is killed. See docs/api.md, "Streaming exec".
 */
import { PassThrough } from "node:stream";
import { StringDecoder } from "node:string_decoder";
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { MAX_UNREAD_OUTPUT_BYTES, NDJSON_CONTENT_TYPE } from "../../common/limits.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import { toHttpError } from "../errors.js";
import { ndjsonLine, readNdjson } from "../ndjson.js";
import { BinaryBody, ExecBody, ExecStreamEvent, errorResponses, SandboxParams } from "../schemas.js";
import { compileBodyValidator } from "../validation.js";
import { exitCodeOf, type OutputEncoding } from "../wire.js";
import { execOptions } from "./guest-calls.js";

/** One NDJSON request line: the exec request, or a stdin frame (up to 1 MiB of data as base64, with room to spare). */
const MAX_REQUEST_LINE_BYTES = 2 * 1024 * 1024;

const StdinFrame = Type.Union([
  Type.Object({ stdin: Type.String() }, { additionalProperties: false }),
  Type.Object({ stdin_b64: Type.String() }, { additionalProperties: false }),
  Type.Object({ eof: Type.Literal(true) }, { additionalProperties: false }),
]);
const validateExecLine = compileBodyValidator(ExecBody, "NDJSON request line 1");
const validateStdinFrame = compileBodyValidator(StdinFrame, "NDJSON stdin frame");

type StreamBody = Static<typeof ExecBody> | NodeJS.ReadableStream;

type StreamRoute = { Params: Static<typeof SandboxParams>; Body: StreamBody };

export function registerExecStreamRoute(scope: FastifyInstance, context: ApiContext): void {
  // Only the two documented bodies: a route whose schema is given per content type validates no other type, so
  // a text/plain body (which Fastify parses by default) would reach the handler unchecked.
  scope.removeContentTypeParser("text/plain");
  scope.addContentTypeParser(NDJSON_CONTENT_TYPE, (_request, payload, done) => done(null, payload));
  scope.post<StreamRoute>("/v1/sandboxes/:id/exec/stream", { schema: streamSchema }, (request, reply) =>
    streamExec(context, request, reply),
  );
}

const streamSchema = {
  tags: ["sandboxes"],
  summary: "Run a command, streaming its output (NDJSON) as it happens; optional streamed stdin",
  description:
    "Request: an exec body as JSON, or application/x-ndjson whose first line is the exec body and whose " +
    'next lines are stdin frames {"stdin": text} | {"stdin_b64": base64} | {"eof": true}. Response: ' +
    "application/x-ndjson events (see ExecStreamEvent). Errors before the stream starts are ordinary " +
    'JSON errors; after it started they are an {"type": "error"} line. Disconnecting kills the process.',
  params: SandboxParams,
  body: {
    content: {
      "application/json": { schema: ExecBody },
      [NDJSON_CONTENT_TYPE]: { schema: BinaryBody },
    },
  },
  response: {
    200: {
      description: "NDJSON event stream",
      content: { [NDJSON_CONTENT_TYPE]: { schema: ExecStreamEvent } },
    },
    ...errorResponses,
  },
};

async function streamExec(context: ApiContext, request: FastifyRequest<StreamRoute>, reply: FastifyReply) {
  const id = request.params.id;
  const { exec, stdin } = await readRequest(request.body);
  const options = execOptions(exec);
  const encoding: OutputEncoding = exec.encoding ?? "utf8";
  const { sandboxes } = servicesOf(request);
  sandboxes.get(id); // unknown id: a plain 404 before the stream starts

  const events = eventStream(clientSignal(request, reply));
  const stdout = chunkEncoder("stdout", encoding, events.emit);
  const stderr = chunkEncoder("stderr", encoding, events.emit);
  reply.type(NDJSON_CONTENT_TYPE).header("cache-control", "no-store").header("x-accel-buffering", "no");
  events.emit({ type: "started", id });
  const stop = context.metrics.execDuration.startTimer({ op: "exec_stream" });
  const { signal } = events;
  void sandboxes
    .exec(id, exec.args, { ...options, stdin, signal, onStdout: stdout.write, onStderr: stderr.write })
    .then(
      (outcome) => {
        stop({ outcome: "ok" });
        stdout.end();
        stderr.end();
        events.emit({
          type: "exit",
          exit_code: exitCodeOf(outcome),
          signal: outcome.signal,
          timed_out: outcome.timedOut,
          stdout_bytes: outcome.stdoutBytes,
          stderr_bytes: outcome.stderrBytes,
          duration_ms: outcome.durationMs,
        });
      },
      (err: unknown) => {
        stop({ outcome: "error" });
        stdout.end();
        stderr.end();
        const reason = signal.aborted && signal.reason instanceof ForkdError ? signal.reason : err;
        const httpError = toHttpError(reason);
        request.log.info({ err: httpError.message }, "exec stream ended with an error");
        events.emit({ type: "error", error: httpError.message, code: httpError.code });
      },
    )
    .finally(() => events.out.end());
  return reply.send(events.out);
}

/**
 * The response's NDJSON events, and the signal that cancels the exec: the client went away (`gone`), or reads
 * so slowly that more than MAX_UNREAD_OUTPUT_BYTES wait for it. One controller for both causes: no
 * AbortSignal.any, whose sources Node 20 holds only weakly.
 */
function eventStream(gone: AbortSignal) {
  const out = new PassThrough();
  const cancel = new AbortController();
  gone.addEventListener("abort", () => cancel.abort(gone.reason), { once: true });
  const emit = (event: unknown) => {
    if (out.destroyed || out.writableEnded) return;
    out.write(ndjsonLine(event));
    if (out.writableLength > MAX_UNREAD_OUTPUT_BYTES && !cancel.signal.aborted) {
      cancel.abort(
        new ForkdError(
          "unavailable",
          `client read too slowly (over ${MAX_UNREAD_OUTPUT_BYTES} bytes unread)`,
        ),
      );
    }
  };
  return { out, emit, signal: cancel.signal };
}

/** One output stream's chunks as events: UTF-8 text (a character split across chunks kept whole) or base64. */
function chunkEncoder(type: "stdout" | "stderr", encoding: OutputEncoding, emit: (event: unknown) => void) {
  const decoder = encoding === "utf8" ? new StringDecoder("utf8") : undefined;
  return {
    write: (chunk: Buffer) => {
      const data = decoder ? decoder.write(chunk) : chunk.toString("base64");
      if (data !== "") emit({ type, data });
    },
    end: () => {
      const rest = decoder?.end() ?? "";
      if (rest !== "") emit({ type, data: rest });
    },
  };
}

/** The exec request and its stdin, from a JSON body or from an NDJSON body (request line, then stdin frames). */
async function readRequest(
  body: StreamBody | undefined,
): Promise<{ exec: Static<typeof ExecBody>; stdin: Buffer | AsyncIterable<Buffer> | undefined }> {
  if (body === undefined) throw invalidArgument("invalid body: expected a JSON object");
  if (!isStream(body)) {
    if (body.stdin !== undefined && body.stdin_b64 !== undefined) {
      throw invalidArgument("give stdin or stdin_b64, not both");
    }
    const stdin =
      body.stdin !== undefined
        ? Buffer.from(body.stdin)
        : body.stdin_b64 !== undefined
          ? Buffer.from(body.stdin_b64, "base64")
          : undefined;
    return { exec: body, stdin };
  }
  const lines = readNdjson(body as AsyncIterable<Buffer>, MAX_REQUEST_LINE_BYTES);
  const first = await lines.next();
  if (first.done) throw invalidArgument("NDJSON body is empty: the first line must be the exec request");
  const exec = validateExecLine(first.value);
  if (exec.stdin !== undefined || exec.stdin_b64 !== undefined) {
    throw invalidArgument("with an NDJSON body, send stdin as frames after the request line, not inline");
  }
  return { exec, stdin: stdinFrames(lines) };
}

async function* stdinFrames(lines: AsyncGenerator<unknown>): AsyncGenerator<Buffer> {
  for await (const line of lines) {
    const frame = validateStdinFrame(line);
    if ("eof" in frame) return;
    yield "stdin" in frame ? Buffer.from(frame.stdin) : Buffer.from(frame.stdin_b64, "base64");
  }
}

function isStream(body: StreamBody): body is NodeJS.ReadableStream {
  return typeof (body as NodeJS.ReadableStream).pipe === "function";
}
