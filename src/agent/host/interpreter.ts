/**
 * The interpreter ops of AgentClient: warm-up, eval (notebook-style cells) and the contexts they run in
 * (`client.contexts`).
 */
import { ForkdError } from "../../common/errors.js";
import { DisplayData, type EventHeader, type OpArgs, type OpResult, validator } from "../protocol/index.js";
import { type AgentConnection, DEFAULT_GUEST_TIMEOUT_MS } from "./connection.js";
import type { AgentContexts, ContextInfo, EvalOptions, EvalOutcome, WarmupOutcome } from "./types.js";

const utf8Strict = new TextDecoder("utf-8", { fatal: true });
const displayData = validator(DisplayData);

/** `client.contexts` over one connection. */
export function agentContexts(connection: AgentConnection): AgentContexts {
  const call = connection.call.bind(connection);
  return {
    create: async (options = {}) => {
      const args: OpArgs<"context.create"> = {};
      if (options.id !== undefined) args.id = options.id;
      if (options.cwd !== undefined) args.cwd = options.cwd;
      if (options.language !== undefined) args.language = options.language;
      return (await call("context.create", args, undefined, options.signal)).result;
    },
    list: async (options = {}) => (await call("context.list", {}, undefined, options.signal)).result.contexts,
    restart: async (id, options = {}): Promise<ContextInfo> =>
      (await call("context.restart", { id }, undefined, options.signal)).result,
    remove: async (id, options = {}) => {
      await call("context.remove", { id }, undefined, options.signal);
    },
  };
}

/** Runs the template's warm-up code in the warm interpreter; the agent records the resulting warm state. */
export async function warmup(
  connection: AgentConnection,
  code: string,
  options: EvalOptions,
): Promise<WarmupOutcome> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
  const { result } = await connection.call(
    "warmup",
    { timeout_ms: timeoutMs },
    Buffer.from(code, "utf8"),
    options.signal,
    {
      deadlineMs: timeoutMs + connection.graceMs,
    },
  );
  return { ...toEvalOutcome(result), warm: result.warm };
}

/** Runs a notebook-style cell in a persistent Python namespace (a context; default `default`). */
export async function evalCell(
  connection: AgentConnection,
  code: string,
  options: EvalOptions,
): Promise<EvalOutcome> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
  const args: OpArgs<"eval"> = { timeout_ms: timeoutMs };
  if (options.context !== undefined) args.context = options.context;
  if (options.cwd !== undefined) args.cwd = options.cwd;
  if (options.env !== undefined) args.env = options.env;
  const streaming =
    options.onStdout !== undefined || options.onStderr !== undefined || options.onDisplay !== undefined;
  if (streaming) args.stream = true;
  let failure: ForkdError | undefined;
  const onEvent = (event: EventHeader, body: Buffer) => {
    if (!streaming || (event.ev !== "stdout" && event.ev !== "stderr" && event.ev !== "display")) {
      connection.violation("unexpected event for an eval call", { ev: event.ev });
      return;
    }
    let text: string;
    try {
      text = utf8Strict.decode(body);
    } catch {
      failure ??= new ForkdError("internal", "eval: the guest streamed output that is not valid UTF-8");
      return;
    }
    if (event.ev === "stdout") options.onStdout?.(text);
    else if (event.ev === "stderr") options.onStderr?.(text);
    else {
      const data = parseDisplay(text);
      if (data === undefined) connection.violation("eval: a display event that is not DisplayData", {});
      else options.onDisplay?.(data);
    }
  };
  const { result } = await connection.call("eval", args, Buffer.from(code, "utf8"), options.signal, {
    deadlineMs: timeoutMs + connection.graceMs,
    onEvent,
  });
  if (failure) throw failure;
  return toEvalOutcome(result);
}

/** A display event's body, checked like every other guest message; undefined when it is not DisplayData. */
function parseDisplay(text: string): DisplayData | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return displayData.check(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

function toEvalOutcome(r: OpResult<"eval">): EvalOutcome {
  const out: EvalOutcome = {
    result: r.result,
    resultTruncated: r.result_truncated,
    stdout: r.stdout,
    stderr: r.stderr,
    stdoutTruncated: r.stdout_truncated,
    stderrTruncated: r.stderr_truncated,
    error: r.error,
    timedOut: r.timed_out,
    durationMs: r.duration_ms,
  };
  if (r.formats !== undefined) out.formats = r.formats;
  if (r.execution_count !== undefined) out.executionCount = r.execution_count;
  return out;
}
