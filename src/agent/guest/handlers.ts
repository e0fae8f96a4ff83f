/** The op table of the agent: what each op does with the agent's state, fix-ups and warm interpreter. */
import os from "node:os";
import { performance } from "node:perf_hooks";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { isValidSandboxId } from "../../common/names.js";
import {
  type EvalResult,
  type HelloHeader,
  MAX_ENTROPY_BYTES,
  MIN_ENTROPY_BYTES,
  PROTOCOL_VERSION,
  type WarmState,
} from "../protocol/index.js";
import type { CallContext } from "./call.js";
import { runExec } from "./exec.js";
import { fileList, fileRead, fileRemove, fileStat, fileWrite } from "./files.js";
import { type Fixups, stopPit } from "./fixups.js";
import type { PythonWorker } from "./python.js";
import type { OpHandlers } from "./server.js";
import type { TemplateInfo } from "./template.js";
import { AGENT_VERSION } from "./version.js";

const MAX_TIME_NS = 2n ** 63n - 1n;
const utf8 = new TextDecoder("utf-8", { fatal: true });

export interface AgentState {
  template: TemplateInfo;
  python: PythonWorker | null;
  fixups: Fixups;
  /** Environment every exec'd process starts from (the request's env is laid over it). */
  baseEnv: NodeJS.ProcessEnv;
  sandboxId: string | null;
  /** Hostname set by the last restore; null until then (the kernel's own name is reported). */
  hostname: string | null;
}

export function warmState(state: AgentState): WarmState {
  if (state.template.problem !== null) return "failed";
  return state.python?.warm ?? "warm";
}

export function helloFor(state: AgentState): HelloHeader {
  return {
    t: "hello",
    protocol: PROTOCOL_VERSION,
    agent_version: AGENT_VERSION,
    template: state.template.name,
    interpreter: state.template.interpreter,
    warm: warmState(state),
    sandbox_id: state.sandboxId,
  };
}

function decodeCode(body: Buffer, op: string): string {
  try {
    return utf8.decode(body);
  } catch {
    throw invalidArgument(`${op}: the code in the request body is not valid UTF-8`);
  }
}

function requirePython(state: AgentState, op: string): PythonWorker {
  if (state.python === null) {
    throw invalidArgument(`${op}: template ${state.template.name} has no interpreter (interpreter: "none")`);
  }
  return state.python;
}

const noWarmupNeeded = (): EvalResult => ({
  result: null,
  result_truncated: false,
  stdout: "",
  stderr: "",
  stdout_truncated: false,
  stderr_truncated: false,
  error: null,
  timed_out: false,
  duration_ms: 0,
});

export function createHandlers(state: AgentState): OpHandlers {
  return {
    ping: async () => ({
      result: {
        protocol: PROTOCOL_VERSION,
        agent_version: AGENT_VERSION,
        template: state.template.name,
        interpreter: state.template.interpreter,
        warm: warmState(state),
        sandbox_id: state.sandboxId,
        hostname: state.hostname ?? os.hostname(),
        uptime_ms: Math.round(process.uptime() * 1000),
      },
    }),

    restore: async (args, entropy) => {
      const started = performance.now();
      if (!isValidSandboxId(args.sandbox_id)) {
        throw invalidArgument(
          `restore: invalid sandbox id ${JSON.stringify(args.sandbox_id)}: expected sb-<12 hex>`,
        );
      }
      if (entropy.length < MIN_ENTROPY_BYTES || entropy.length > MAX_ENTROPY_BYTES) {
        throw invalidArgument(
          `restore: entropy must be ${MIN_ENTROPY_BYTES}..${MAX_ENTROPY_BYTES} bytes in the body, got ${entropy.length}`,
        );
      }
      const timeNs = BigInt(args.time_ns);
      if (timeNs > MAX_TIME_NS) throw invalidArgument(`restore: time_ns ${args.time_ns} is out of range`);
      // Entropy first: whatever runs after this (including the clock and hostname calls) sees the new CRNG.
      state.fixups.addEntropy(entropy);
      state.fixups.setRealtimeClock(timeNs);
      state.fixups.setHostname(args.hostname);
      state.sandboxId = args.sandbox_id;
      state.hostname = args.hostname;
      state.python?.markRestored();
      return {
        result: {
          applied: state.fixups.kind,
          entropy_bytes: entropy.length,
          hostname: args.hostname,
          sandbox_id: args.sandbox_id,
          duration_ms: performance.now() - started,
        },
      };
    },

    warmup: async (args, body, ctx) => {
      const code = decodeCode(body, "warmup");
      if (state.python === null) {
        if (code.trim() !== "") requirePython(state, "warmup");
        return { result: { ...noWarmupNeeded(), warm: warmState(state) } };
      }
      return { result: await state.python.warmup(code, { timeoutMs: args.timeout_ms, signal: ctx.signal }) };
    },

    eval: async (args, body, ctx) => {
      const python = requirePython(state, "eval");
      const code = decodeCode(body, "eval");
      return { result: await python.runCell(code, { timeoutMs: args.timeout_ms, signal: ctx.signal }) };
    },

    exec: (args, body, ctx: CallContext) => runExec(args, body, ctx, state.baseEnv),
    "file.write": (args, body) => fileWrite(args, body),
    "file.read": (args) => fileRead(args),
    "file.list": (args) => fileList(args),
    "file.stat": (args) => fileStat(args),
    "file.remove": (args) => fileRemove(args),
    // Served by the Go agent that replaces this one (src/agent/guest/*.go).
    "file.mkdir": notYet("file.mkdir"),
    "file.move": notYet("file.move"),
    watch: notYet("watch"),
    "context.create": notYet("context.create"),
    "context.list": notYet("context.list"),
    "context.restart": notYet("context.restart"),
    "context.remove": notYet("context.remove"),
    "proc.start": notYet("proc.start"),
    "proc.connect": notYet("proc.connect"),
    "proc.list": notYet("proc.list"),
    "proc.input": notYet("proc.input"),
    "proc.signal": notYet("proc.signal"),
    "proc.resize": notYet("proc.resize"),
  };
}

const notYet = (op: string) => async (): Promise<never> => {
  throw new ForkdError("not_implemented", `${op} is not served by this agent`);
};

/** Fix-ups that could not be loaded (koffi missing or broken): every restore reports why. */
export function unavailableFixups(reason: string): Fixups {
  const fail = () => {
    throw new ForkdError("internal", `restore fix-ups are unavailable: ${reason}`);
  };
  return {
    kind: "system",
    setRealtimeClock: fail,
    addEntropy: fail,
    setHostname: fail,
    prime: async () => {},
    stopPit, // plain file I/O on /dev/port: works without the native calls
  };
}
