/**
 * The streamed exec answer (POST /v1/sandboxes/:id/exec/stream, NDJSON) as typed events: output chunks as they
 * happen, then one exit event. A `{"type":"error"}` line becomes the error class of its code; a stream that ends
 * without an exit is a dropped connection.
 */
import type { IncomingMessage } from "node:http";
import { ERROR_CODES } from "../common/limits.js";
import type { CallScope } from "./call-scope.js";
import { errorFromResponse, ForkdSdkError } from "./errors.js";
import { parseEventStream, StreamFormatError } from "./event-stream.js";
import type { ResolvedSettings } from "./settings.js";
import { describeRequest, type HttpRequest, streamFailure } from "./transport.js";

export type ExecEvent =
  | { type: "stdout"; data: Buffer }
  | { type: "stderr"; data: Buffer }
  | {
      type: "exit";
      /** The exit status; 128+N when killed by signal N. */
      exitCode: number;
      /** The signal that killed the process, e.g. "SIGKILL", or null. */
      signal: string | null;
      /** Killed because it ran past its timeout. */
      timedOut: boolean;
      durationMs: number | null;
    };

export async function* execEvents(
  response: IncomingMessage,
  settings: ResolvedSettings,
  request: HttpRequest,
  scope: CallScope,
): AsyncGenerator<ExecEvent> {
  let exited = false;
  try {
    for await (const record of parseEventStream(response.headers["content-type"], response)) {
      // The daemon ends the stream right after the exit line; reading to its end lets the connection be reused.
      if (exited) continue;
      const event = decodeRecord(record.event, record.data, request);
      if (event === undefined) continue;
      if (event.type === "exit") exited = true;
      yield event;
    }
  } catch (err) {
    if (err instanceof StreamFormatError) throw err;
    throw await streamFailure(settings, request, scope, err);
  }
  if (!exited) {
    if (scope.signal.aborted) throw scope.reason;
    throw await streamFailure(
      settings,
      request,
      scope,
      new Error("the stream ended before the command's exit"),
    );
  }
}

/** One record → event; undefined for records this SDK does not know (newer daemons may add kinds). */
function decodeRecord(kind: string | undefined, data: unknown, request: HttpRequest): ExecEvent | undefined {
  const record = (data !== null && typeof data === "object" ? data : {}) as Record<string, unknown>;
  switch (kind) {
    case "stdout":
    case "stderr":
      return { type: kind, data: decodeBytes(record) };
    case "exit":
      return {
        type: "exit",
        exitCode: typeof record.exit_code === "number" ? record.exit_code : 255,
        signal: typeof record.signal === "string" ? record.signal : null,
        timedOut: record.timed_out === true,
        durationMs: typeof record.duration_ms === "number" ? record.duration_ms : null,
      };
    case "error": {
      const code = typeof record.code === "string" ? record.code : "internal";
      const status = (ERROR_CODES as Record<string, number>)[code] ?? 500;
      const message = typeof record.error === "string" ? record.error : JSON.stringify(record);
      throw errorFromResponse(status, JSON.stringify({ error: message, code }), {
        request: describeRequest(request),
        inStream: true,
      });
    }
    default:
      return undefined;
  }
}

/** The SDK asks for base64 chunks so output bytes arrive exactly as the process wrote them. */
function decodeBytes(record: Record<string, unknown>): Buffer {
  if (typeof record.data === "string") return Buffer.from(record.data, "base64");
  throw new ForkdSdkError(
    `an output record of the exec stream carries no data: ${JSON.stringify(record).slice(0, 200)}`,
  );
}
