/**
 * The streamed exec answer as typed events: output chunks as they happen, then one exit event. Decodes the
 * daemon's records (NDJSON or SSE, see docs/api.md) and fails loudly on a stream that ends without an exit.
 */
import type { IncomingMessage } from "node:http";
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
      /** null when the process was killed by a signal. */
      exitCode: number | null;
      signal: string | null;
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
      const event = decodeRecord(record.event, record.data, request);
      if (event === undefined) continue;
      yield event;
      if (event.type === "exit") {
        exited = true;
        return;
      }
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
        exitCode: typeof record.exit_code === "number" ? record.exit_code : null,
        signal: typeof record.signal === "string" ? record.signal : null,
        timedOut: record.timed_out === true,
        durationMs: typeof record.duration_ms === "number" ? record.duration_ms : null,
      };
    case "error": {
      const status = typeof record.status === "number" ? record.status : 500;
      const message = typeof record.error === "string" ? record.error : JSON.stringify(record);
      throw errorFromResponse(status, JSON.stringify({ error: message, code: record.code }), {
        request: describeRequest(request),
      });
    }
    default:
      return undefined;
  }
}

function decodeBytes(record: Record<string, unknown>): Buffer {
  if (typeof record.data_base64 === "string") return Buffer.from(record.data_base64, "base64");
  if (typeof record.data === "string") {
    return record.encoding === "base64"
      ? Buffer.from(record.data, "base64")
      : Buffer.from(record.data, "utf8");
  }
  throw new ForkdSdkError(
    `an output record of the exec stream carries no data: ${JSON.stringify(record).slice(0, 200)}`,
  );
}
