/**
 * The buffered calls into a sandbox's guest: ping (a round trip to its agent), exec (a command, its output when
 * it exits) and eval (a Python cell in the warm interpreter). Streaming exec is exec-stream.ts.
 */
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { DEFAULT_EXEC_TIMEOUT_SECS } from "../../common/limits.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import {
  EvalBody,
  EvalResponse,
  ExecBody,
  ExecResponse,
  errorResponses,
  MAX_EXEC_REQUEST_BYTES,
  PingResponse,
  SandboxParams,
} from "../schemas.js";
import { evalToWire, execToWire, pingToWire } from "../wire.js";

type IdRoute = { Params: Static<typeof SandboxParams> };
type ExecRoute = IdRoute & { Body: Static<typeof ExecBody> };
type EvalRoute = IdRoute & { Body: Static<typeof EvalBody> };

export function registerGuestCallRoutes(app: FastifyInstance, context: ApiContext): void {
  app.post<IdRoute>("/v1/sandboxes/:id/ping", { schema: pingSchema }, pingSandbox);
  app.post<ExecRoute>("/v1/sandboxes/:id/exec", { schema: execSchema }, (request, reply) =>
    execInSandbox(context, request, reply),
  );
  app.post<EvalRoute>("/v1/sandboxes/:id/eval", { schema: evalSchema }, (request, reply) =>
    evalInSandbox(context, request, reply),
  );
}

const pingSchema = {
  tags: ["sandboxes"],
  summary: "Round trip to the guest agent",
  params: SandboxParams,
  response: { 200: PingResponse, ...errorResponses },
};

async function pingSandbox(request: FastifyRequest<IdRoute>, reply: FastifyReply) {
  const { sandboxes } = servicesOf(request);
  return pingToWire(await sandboxes.ping(request.params.id, { signal: clientSignal(request, reply) }));
}

const execSchema = {
  tags: ["sandboxes"],
  summary: "Run a command (argv, no shell) and return its output when it exits",
  description:
    "Output is captured up to 1 MiB per stream (see *_truncated); use /exec/stream for more or for live " +
    "output. A timeout kills the process group: timed_out=true, exit_code 128+9.",
  params: SandboxParams,
  body: ExecBody,
  response: { 200: ExecResponse, ...errorResponses },
};

async function execInSandbox(context: ApiContext, request: FastifyRequest<ExecRoute>, reply: FastifyReply) {
  const body = request.body;
  const options = execOptions(body);
  const outcome = await timed(context, "exec", () =>
    servicesOf(request).sandboxes.exec(request.params.id, body.args, {
      ...options,
      stdin: stdinOf(body),
      signal: clientSignal(request, reply),
    }),
  );
  return execToWire(outcome, body.encoding ?? "utf8");
}

const evalSchema = {
  tags: ["sandboxes"],
  summary: "Evaluate Python in the sandbox's warm interpreter",
  description:
    "The result is repr() of the cell's trailing expression. A Python exception is not an HTTP error.",
  params: SandboxParams,
  body: EvalBody,
  response: { 200: EvalResponse, ...errorResponses },
};

async function evalInSandbox(context: ApiContext, request: FastifyRequest<EvalRoute>, reply: FastifyReply) {
  const body = request.body;
  const outcome = await timed(context, "eval", () =>
    servicesOf(request).sandboxes.eval(request.params.id, body.code, {
      timeoutMs: timeoutMsOf(body, undefined),
      signal: clientSignal(request, reply),
    }),
  );
  return evalToWire(outcome);
}

/** `call` timed in forkd_exec_duration_seconds under `op`, by how it ended. */
async function timed<T>(context: ApiContext, op: "exec" | "eval", call: () => Promise<T>): Promise<T> {
  const stop = context.metrics.execDuration.startTimer({ op });
  try {
    const outcome = await call();
    stop({ outcome: "ok" });
    return outcome;
  } catch (err) {
    stop({ outcome: "error" });
    throw err;
  }
}

/** Guest-side timeout of an exec/eval: timeout_ms or v0.5's timeout_secs (not both); `fallbackSecs` otherwise. */
export function timeoutMsOf(
  body: { timeout_ms?: number; timeout_secs?: number },
  fallbackSecs: number | undefined,
): number | undefined {
  if (body.timeout_ms !== undefined && body.timeout_secs !== undefined) {
    throw invalidArgument("give timeout_ms or timeout_secs, not both");
  }
  if (body.timeout_ms !== undefined) return body.timeout_ms;
  if (body.timeout_secs !== undefined) return body.timeout_secs * 1000;
  return fallbackSecs === undefined ? undefined : fallbackSecs * 1000;
}

export function execOptions(body: Static<typeof ExecBody>) {
  if (body.cwd !== undefined && !body.cwd.startsWith("/")) {
    throw invalidArgument(
      `invalid body field "cwd": must be an absolute path, got ${JSON.stringify(body.cwd)}`,
    );
  }
  const bytes = Buffer.byteLength(JSON.stringify([body.args, body.env ?? {}, body.cwd ?? ""]));
  if (bytes > MAX_EXEC_REQUEST_BYTES) {
    throw new ForkdError(
      "payload_too_large",
      `args, env and cwd take ${bytes} bytes; at most ${MAX_EXEC_REQUEST_BYTES} fit in one exec ` +
        "(pass large inputs through stdin or a file)",
    );
  }
  return {
    timeoutMs: timeoutMsOf(body, DEFAULT_EXEC_TIMEOUT_SECS),
    env: body.env,
    cwd: body.cwd,
  };
}

function stdinOf(body: Static<typeof ExecBody>): Buffer | undefined {
  if (body.stdin !== undefined && body.stdin_b64 !== undefined) {
    throw invalidArgument("give stdin or stdin_b64, not both");
  }
  if (body.stdin !== undefined) return Buffer.from(body.stdin, "utf8");
  if (body.stdin_b64 !== undefined) {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(body.stdin_b64)) {
      throw new ForkdError("invalid_argument", 'invalid body field "stdin_b64": not base64');
    }
    return Buffer.from(body.stdin_b64, "base64");
  }
  return undefined;
}
