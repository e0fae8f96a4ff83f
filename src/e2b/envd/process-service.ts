/**
 * envd's Process service (process.proto) over the sandbox's agent: processes live in the agent's table, so they
 * outlive the call that started them, are found again by pid or tag, and survive fork and BRANCH. A call that
 * ends early (the client went away, its deadline passed) only detaches: the process keeps running, as in E2B;
 * the deadline given at Start (Connect-Timeout-Ms) is also the process's own limit, as envd's is.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type {
  ProcSelector as AgentSelector,
  ProcEnd,
  ProcHandle,
  ProcSignalName,
} from "../../agent/host/types.js";
import { ForkdError } from "../../common/errors.js";
import type { E2bContext } from "../context.js";
import { toConnectError } from "../errors.js";
import {
  type Process,
  type ProcessEvent_EndEvent,
  type ProcessEventSchema,
  type ProcessSelector,
  Signal,
} from "./gen/process/process_pb.js";
import { KEEPALIVE, keepaliveIntervalMs, withKeepalives } from "./keepalive.js";
import { resolveGuestPath } from "./paths.js";
import { callUser, servicesOfCall, sessionOf } from "./rpc-session.js";

/** StartResponse and ConnectResponse each carry one ProcessEvent. */
type EventInit = MessageInitShape<typeof ProcessEventSchema>;

const MAX_PTY_DIMENSION = 1000;

/** Go's words for the signals envd's status strings name ("signal: killed"). */
const SIGNAL_WORDS: Record<string, string> = {
  SIGKILL: "killed",
  SIGTERM: "terminated",
  SIGINT: "interrupt",
  SIGHUP: "hangup",
  SIGQUIT: "quit",
  SIGABRT: "aborted",
  SIGSEGV: "segmentation fault",
  SIGPIPE: "broken pipe",
  SIGUSR1: "user defined signal 1",
  SIGUSR2: "user defined signal 2",
  SIGBUS: "bus error",
  SIGFPE: "floating point exception",
  SIGILL: "illegal instruction",
  SIGTRAP: "trace/breakpoint trap",
  SIGALRM: "alarm clock",
};

/** An end as envd reports it: exit_code -1 when a signal ended the process; `error` set unless it exited 0. */
export function endEvent(end: ProcEnd): Omit<ProcessEvent_EndEvent, "$typeName" | "$unknown"> {
  if (end.error !== null) {
    return { exitCode: -1, exited: false, status: end.error, error: end.error };
  }
  if (end.exitCode !== null && end.signal === null) {
    const status = `exit status ${end.exitCode}`;
    return end.exitCode === 0
      ? { exitCode: 0, exited: true, status }
      : { exitCode: end.exitCode, exited: true, status, error: status };
  }
  const signal = end.signal ?? "SIGKILL";
  const status = `signal: ${SIGNAL_WORDS[signal] ?? signal.toLowerCase()}`;
  return { exitCode: -1, exited: false, status, error: status };
}

function selectorOf(selector: ProcessSelector | undefined): AgentSelector {
  const chosen = selector?.selector;
  if (chosen?.case === "pid") return { pid: chosen.value };
  if (chosen?.case === "tag") return { tag: chosen.value };
  throw new ConnectError("a process selector (pid or tag) is required", Code.InvalidArgument);
}

const SIGNALS: Partial<Record<Signal, ProcSignalName>> = {
  [Signal.SIGTERM]: "SIGTERM",
  [Signal.SIGKILL]: "SIGKILL",
};

/**
 * The events of an attached process as envd streams them: start, data (with keepalives while quiet), end.
 * Starting failures surface as errors before any event (envd: InvalidArgument).
 */
async function* processEvents(
  handle: ProcHandle,
  ctx: HandlerContext,
  startFailure: (err: unknown) => ConnectError,
): AsyncGenerator<EventInit> {
  let pid: number;
  try {
    pid = await handle.pid;
  } catch (err) {
    throw startFailure(err);
  }
  yield { event: { case: "start", value: { pid } } };
  try {
    for await (const item of withKeepalives(handle.output, keepaliveIntervalMs(ctx.requestHeader))) {
      if (item === KEEPALIVE) {
        yield { event: { case: "keepalive", value: {} } };
        continue;
      }
      yield { event: { case: "data", value: { output: { case: item.stream, value: item.data } } } };
    }
    yield { event: { case: "end", value: endEvent(await handle.done) } };
  } catch (err) {
    throw toConnectError(err);
  } finally {
    // Leaving early (client gone, deadline) leaves the process running.
    handle.detach();
  }
}

type ProcessImpl = ServiceImpl<typeof Process>;
type RequestOf<M extends keyof ProcessImpl> = Parameters<ProcessImpl[M]>[0];

export function processService(context: E2bContext): ProcessImpl {
  return {
    start: (request, ctx) => startProcess(context, request, ctx),
    connect: (request, ctx) => connectProcess(request, ctx),
    list: (_request, ctx) => listProcesses(ctx),
    sendInput: (request, ctx) => sendInput(request, ctx),
    streamInput: (requests, ctx) => streamInput(requests, ctx),
    sendSignal: (request, ctx) => sendSignal(request, ctx),
    closeStdin: (request, ctx) => closeStdin(request, ctx),
    update: (request, ctx) => updateProcess(request, ctx),
  };
}

/** The call's sandbox's processes, as its caller's view of the services (that one sandbox) reaches them. */
const procsOf = (ctx: HandlerContext) => servicesOfCall(ctx).sandboxes.procs;

async function* startProcess(
  context: E2bContext,
  request: RequestOf<"start">,
  ctx: HandlerContext,
): AsyncGenerator<{ event: EventInit }> {
  const session = sessionOf(ctx);
  const user = await callUser(context, ctx);
  const config = request.process;
  if (!config || config.cmd === "") {
    throw new ConnectError("process.cmd is required", Code.InvalidArgument);
  }
  const size = request.pty?.size;
  if (request.pty !== undefined) {
    if (!size || !inRange(size.cols) || !inRange(size.rows)) {
      throw new ConnectError(
        `pty size must be 1..${MAX_PTY_DIMENSION} columns and rows`,
        Code.InvalidArgument,
      );
    }
  }
  let cwd: string;
  try {
    // No cwd: the template's working directory (setWorkdir / WORKDIR), else the user's home, as E2B's envd.
    const requested =
      config.cwd === undefined || config.cwd === ""
        ? await context.users.templateWorkdir(
            servicesOfCall(ctx).sandboxes.files,
            session.sandboxId,
            ctx.signal,
          )
        : config.cwd;
    cwd = resolveGuestPath(requested, user);
  } catch (err) {
    throw toConnectError(err);
  }
  const remaining = ctx.timeoutMs();
  let handle: ProcHandle;
  try {
    handle = procsOf(ctx).start(session.sandboxId, [config.cmd, ...config.args], {
      env: { HOME: user.home, USER: user.name, LOGNAME: user.name, ...config.envs },
      cwd,
      user: user.name,
      ...(request.tag !== undefined ? { tag: request.tag } : {}),
      ...(size ? { pty: { cols: size.cols, rows: size.rows } } : {}),
      stdin: request.stdin ?? true,
      ...(remaining !== undefined && remaining > 0 ? { timeoutMs: remaining } : {}),
      signal: ctx.signal,
    });
  } catch (err) {
    throw toConnectError(err);
  }
  const events = processEvents(handle, ctx, (err) => {
    const connect = toConnectError(err);
    // envd answers a process that cannot start (no such program, cwd missing) with InvalidArgument.
    return connect.code === Code.NotFound
      ? new ConnectError(
          `error starting process '${config.cmd}': ${connect.rawMessage}`,
          Code.InvalidArgument,
        )
      : connect;
  });
  for await (const event of events) yield { event };
}

async function* connectProcess(
  request: RequestOf<"connect">,
  ctx: HandlerContext,
): AsyncGenerator<{ event: EventInit }> {
  const session = sessionOf(ctx);
  const selector = selectorOf(request.process);
  let handle: ProcHandle;
  try {
    handle = procsOf(ctx).connect(session.sandboxId, selector, { signal: ctx.signal });
  } catch (err) {
    throw toConnectError(err);
  }
  for await (const event of processEvents(handle, ctx, toConnectError)) yield { event };
}

async function listProcesses(ctx: HandlerContext) {
  const session = sessionOf(ctx);
  try {
    const processes = await procsOf(ctx).list(session.sandboxId, { signal: ctx.signal });
    return {
      processes: processes
        .filter((p) => p.running)
        .map((p) => ({
          pid: p.pid,
          ...(p.tag !== null ? { tag: p.tag } : {}),
          config: { cmd: p.argv[0] ?? "", args: p.argv.slice(1), envs: p.env, cwd: p.cwd },
        })),
    };
  } catch (err) {
    throw toConnectError(err);
  }
}

async function sendInput(request: RequestOf<"sendInput">, ctx: HandlerContext) {
  const session = sessionOf(ctx);
  const selector = selectorOf(request.process);
  const input = request.input?.input;
  if (input?.case !== "stdin" && input?.case !== "pty") {
    throw new ConnectError("input (stdin or pty bytes) is required", Code.InvalidArgument);
  }
  await call(() =>
    procsOf(ctx).input(session.sandboxId, selector, Buffer.from(input.value), { signal: ctx.signal }),
  );
  return {};
}

async function streamInput(requests: RequestOf<"streamInput">, ctx: HandlerContext) {
  const session = sessionOf(ctx);
  let selector: AgentSelector | undefined;
  for await (const message of requests) {
    const event = message.event;
    if (event.case === "start") selector = selectorOf(event.value.process);
    else if (event.case === "data") {
      if (selector === undefined) {
        throw new ConnectError("the stream must start with a start event", Code.InvalidArgument);
      }
      const input = event.value.input?.input;
      if (input?.case === "stdin" || input?.case === "pty") {
        const target = selector;
        await call(() =>
          procsOf(ctx).input(session.sandboxId, target, Buffer.from(input.value), { signal: ctx.signal }),
        );
      }
    }
  }
  return {};
}

async function sendSignal(request: RequestOf<"sendSignal">, ctx: HandlerContext) {
  const session = sessionOf(ctx);
  const selector = selectorOf(request.process);
  const signal = SIGNALS[request.signal];
  if (signal === undefined) {
    throw new ConnectError("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL", Code.InvalidArgument);
  }
  await call(() => procsOf(ctx).signal(session.sandboxId, selector, signal, { signal: ctx.signal }));
  return {};
}

async function closeStdin(request: RequestOf<"closeStdin">, ctx: HandlerContext) {
  const session = sessionOf(ctx);
  const selector = selectorOf(request.process);
  await call(() => procsOf(ctx).closeStdin(session.sandboxId, selector, { signal: ctx.signal }));
  return {};
}

async function updateProcess(request: RequestOf<"update">, ctx: HandlerContext) {
  const session = sessionOf(ctx);
  const selector = selectorOf(request.process);
  const size = request.pty?.size;
  if (size === undefined) return {};
  if (!inRange(size.cols) || !inRange(size.rows)) {
    throw new ConnectError(`pty size must be 1..${MAX_PTY_DIMENSION} columns and rows`, Code.InvalidArgument);
  }
  await call(() =>
    procsOf(ctx).resize(
      session.sandboxId,
      selector,
      { cols: size.cols, rows: size.rows },
      { signal: ctx.signal },
    ),
  );
  return {};
}

function inRange(n: number): boolean {
  return Number.isInteger(n) && n >= 1 && n <= MAX_PTY_DIMENSION;
}

async function call<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ForkdError || err instanceof Error) throw toConnectError(err);
    throw err;
  }
}
