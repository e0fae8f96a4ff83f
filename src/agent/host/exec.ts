/** AgentClient's exec: a program run to its end, output captured (bounded) and streamed, stdin inline or windowed. */
import { ForkdError } from "../../common/errors.js";
import {
  type EventHeader,
  encodeFrame,
  type OpArgs,
  type OpResult,
  STDIN_CHUNK_BYTES,
  STDIN_INLINE_BYTES,
  STDIN_WINDOW_BYTES,
} from "../protocol/index.js";
import { type AgentConnection, DEFAULT_GUEST_TIMEOUT_MS } from "./connection.js";
import type { ExecOptions, ExecOutcome } from "./types.js";

const DEFAULT_CAPTURE_BYTES = 1024 * 1024;

type StdinSource = NonNullable<ExecOptions["stdin"]>;

/** Keeps at most `limit` bytes of a stream, remembering whether more came. */
class Capture {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  total = 0;
  truncated = false;

  constructor(private readonly limit: number) {}

  add(chunk: Buffer): void {
    this.total += chunk.length;
    const room = this.limit - this.kept;
    if (chunk.length > room) this.truncated = true;
    if (room <= 0) return;
    const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.chunks.push(part);
    this.kept += part.length;
  }

  bytes(): Buffer {
    return Buffer.concat(this.chunks, this.kept);
  }
}

/** The stdin window of one exec call: what was sent, what the guest acknowledged, who waits for more room. */
class StdinWindow {
  acked = 0;
  sent = 0;
  /** The call was answered (or failed). */
  answered = false;
  /** The first failure of the stream (a lying guest, an unreadable source); the call fails with it. */
  failure: Error | undefined;
  private waiter: (() => void) | undefined;

  get over(): boolean {
    return this.answered || this.failure !== undefined;
  }

  onAck(wake: () => void): void {
    this.waiter = wake;
  }

  wake(): void {
    this.waiter?.();
  }
}

/** Runs a program (argv, no shell) in the guest; output streams to the callbacks as it is produced. */
export async function runExec(
  connection: AgentConnection,
  argv: string[],
  options: ExecOptions,
): Promise<ExecOutcome> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
  const captureLimit = options.maxCaptureBytes ?? DEFAULT_CAPTURE_BYTES;
  const stdout = new Capture(captureLimit);
  const stderr = new Capture(captureLimit);
  const { args, inline } = execRequest(argv, options, timeoutMs);
  const window = new StdinWindow();
  // Set once the call exists: a refused acknowledgement cancels it.
  let callId = 0;
  const onEvent = (event: EventHeader, body: Buffer) => {
    if (event.ev === "stdout") {
      stdout.add(body);
      options.onStdout?.(body);
    } else if (event.ev === "stderr") {
      stderr.add(body);
      options.onStderr?.(body);
    } else if (event.ev === "stdin_ack") {
      acknowledge(connection, callId, args.stdin === "stream", window, event.bytes ?? 0);
    } else {
      connection.violation("unexpected event for an exec call", { ev: event.ev });
    }
  };
  const { id, answer: call } = connection.start("exec", args, inline, options.signal, {
    deadlineMs: timeoutMs + connection.graceMs,
    onEvent,
  });
  callId = id;
  if (args.stdin === "stream" && options.stdin !== undefined) {
    const settle = () => {
      window.answered = true;
      window.wake();
    };
    call.then(settle, settle);
    streamStdin(connection, id, options.stdin, window).catch((err: unknown) => {
      const message = err instanceof Error ? err.message : String(err);
      window.failure ??=
        err instanceof ForkdError
          ? err
          : new ForkdError("invalid_argument", `exec: reading stdin failed: ${message}`);
      connection.cancel(id);
    });
  }
  let answer: Awaited<typeof call>;
  try {
    answer = await call;
  } catch (err) {
    if (window.failure) throw window.failure;
    throw err;
  }
  if (window.failure) throw window.failure;
  return toExecOutcome(answer.result, stdout, stderr);
}

/** The exec request and the stdin sent in its body (small enough: inline; larger or a stream: `in` frames). */
function execRequest(
  argv: string[],
  options: ExecOptions,
  timeoutMs: number,
): { args: OpArgs<"exec">; inline: Buffer | undefined } {
  const input = options.stdin;
  let inline: Buffer | undefined;
  if (typeof input === "string" || Buffer.isBuffer(input)) {
    const bytes = typeof input === "string" ? Buffer.from(input, "utf8") : input;
    if (bytes.length <= STDIN_INLINE_BYTES) inline = bytes;
  }
  const mode = input === undefined ? "none" : inline !== undefined ? "body" : "stream";
  const args: OpArgs<"exec"> = { argv, stdin: mode, timeout_ms: timeoutMs };
  if (options.env !== undefined) args.env = options.env;
  if (options.cwd !== undefined) args.cwd = options.cwd;
  if (options.user !== undefined) args.user = options.user;
  return { args, inline };
}

/** A stdin_ack: opens the window, or fails the call when the guest acknowledges bytes never sent. */
function acknowledge(
  connection: AgentConnection,
  callId: number,
  streaming: boolean,
  window: StdinWindow,
  bytes: number,
): void {
  const { acked, sent } = window;
  // A hostile guest acknowledging bytes it never received would open the window past its bound.
  if (!streaming || acked + bytes > sent) {
    connection.violation("stdin_ack beyond the bytes sent", { acked, bytes, sent });
    window.failure ??= new ForkdError(
      "internal",
      `exec: the guest acknowledged ${acked + bytes} stdin bytes but only ${sent} were sent`,
    );
    // Fail now: the guest's answer to a call it has lied about means nothing.
    connection.failCall(callId, window.failure);
    connection.cancel(callId);
    window.wake();
    return;
  }
  window.acked += bytes;
  window.wake();
}

/** Sends stdin in `in` frames, never more than STDIN_WINDOW_BYTES ahead of the guest's acknowledgements. */
async function streamStdin(
  connection: AgentConnection,
  id: number,
  source: StdinSource,
  window: StdinWindow,
): Promise<void> {
  // Over once the call was answered, failed before it was sent, or the connection went away.
  const over = () => window.over || !connection.isPending(id) || connection.closed;
  let sent = 0;
  const waitForWindow = (size: number) =>
    new Promise<void>((resolve) => {
      const check = () => {
        if (over() || sent - window.acked + size <= STDIN_WINDOW_BYTES) resolve();
        else window.onAck(check);
      };
      check();
    });
  const chunks: Iterable<Buffer | string> | AsyncIterable<Buffer | Uint8Array | string> =
    typeof source === "string" || Buffer.isBuffer(source) ? [source] : source;
  for await (const item of chunks) {
    if (over()) return;
    const bytes =
      typeof item === "string"
        ? Buffer.from(item, "utf8")
        : Buffer.from(item.buffer, item.byteOffset, item.byteLength);
    for (let at = 0; at < bytes.length; at += STDIN_CHUNK_BYTES) {
      const piece = bytes.subarray(at, at + STDIN_CHUNK_BYTES);
      await waitForWindow(piece.length);
      if (over()) return;
      // The stdin window bounds this call's own input; the check bounds all calls' together.
      const frame = encodeFrame({ t: "in", id }, piece);
      connection.assertRoomToSend(frame.length, `agent stdin of call ${id}`);
      // Counted before the write: an acknowledgement can only follow the bytes it acknowledges.
      sent += piece.length;
      window.sent += piece.length;
      connection.send(frame);
    }
  }
  if (!over()) connection.send(encodeFrame({ t: "in", id, eof: true }));
}

function toExecOutcome(r: OpResult<"exec">, stdout: Capture, stderr: Capture): ExecOutcome {
  return {
    exitCode: r.exit_code,
    signal: r.signal,
    timedOut: r.timed_out,
    stdout: stdout.bytes(),
    stderr: stderr.bytes(),
    stdoutTruncated: stdout.truncated,
    stderrTruncated: stderr.truncated,
    stdoutBytes: r.stdout_bytes,
    stderrBytes: r.stderr_bytes,
    durationMs: r.duration_ms,
  };
}
