/**
 * exec: runs a program in its own process group (so a timeout or cancel kills everything it started), streams
 * its output as events as it is produced, and feeds it stdin from the request body or from `in` frames.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { statSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { ForkdError } from "../../common/errors.js";
import type { ExecArgs, ExecResult } from "../protocol/index.js";
import type { CallContext, OpOutcome } from "./call.js";

export function runExec(args: ExecArgs, stdinBody: Buffer, ctx: CallContext, baseEnv: NodeJS.ProcessEnv) {
  return new Promise<OpOutcome<ExecResult>>((resolve, reject) => {
    const started = performance.now();
    const [program, ...rest] = args.argv as [string, ...string[]];
    const cwd = args.cwd ?? "/";
    if (args.stdin !== "body" && stdinBody.length > 0) {
      reject(new ForkdError("invalid_argument", `exec: a request body is only allowed with stdin "body"`));
      return;
    }
    let child: ChildProcess;
    try {
      // detached: the child calls setsid(), so its pid is also its process group id.
      child = spawn(program, rest, { cwd, env: { ...baseEnv, ...args.env }, detached: true, stdio: "pipe" });
    } catch (err) {
      reject(spawnError(err, program, cwd));
      return;
    }
    let finished = false;
    let timedOut = false;
    let stdoutBytes = 0;
    let stderrBytes = 0;

    const killGroup = () => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        // The group is already gone.
      }
    };
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, args.timeout_ms);
    const onAbort = () => killGroup();
    ctx.signal.addEventListener("abort", onAbort, { once: true });
    const finish = () => {
      finished = true;
      clearTimeout(timer);
      ctx.signal.removeEventListener("abort", onAbort);
    };

    child.on("error", (err) => {
      if (finished || child.pid !== undefined) return;
      finish();
      reject(spawnError(err, program, cwd));
    });
    child.on("close", (code, signal) => {
      if (finished) return;
      finish();
      if (ctx.signal.aborted) {
        reject(ctx.signal.reason);
        return;
      }
      resolve({
        result: {
          exit_code: code,
          signal,
          timed_out: timedOut,
          duration_ms: performance.now() - started,
          stdout_bytes: stdoutBytes,
          stderr_bytes: stderrBytes,
        },
      });
    });

    const forward = (stream: NodeJS.ReadableStream | null, ev: "stdout" | "stderr") => {
      stream?.on("data", (chunk: Buffer) => {
        if (ev === "stdout") stdoutBytes += chunk.length;
        else stderrBytes += chunk.length;
        ctx.emit(ev, chunk);
        if (ctx.congested()) {
          stream.pause();
          ctx.whenDrained(() => stream.resume());
        }
      });
    };
    forward(child.stdout, "stdout");
    forward(child.stderr, "stderr");

    const stdin = child.stdin;
    if (stdin === null) return;
    // The process may exit without reading its input: EPIPE is its business, not the agent's.
    stdin.on("error", () => {});
    if (args.stdin === "none") stdin.end();
    else if (args.stdin === "body") stdin.end(stdinBody);
    else {
      ctx.onInput((chunk, eof) => {
        if (chunk.length > 0) {
          if (stdin.writable) stdin.write(chunk, () => ctx.ackInput(chunk.length));
          else ctx.ackInput(chunk.length);
        }
        if (eof && stdin.writable) stdin.end();
      });
    }
  });
}

function spawnError(err: unknown, program: string, cwd: string): ForkdError {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === "ENOENT") {
    let cwdExists = true;
    try {
      cwdExists = statSync(cwd).isDirectory();
    } catch {
      cwdExists = false;
    }
    if (!cwdExists) return new ForkdError("not_found", `exec: working directory ${cwd} does not exist`);
    return new ForkdError("not_found", `exec: ${program}: no such file or directory (not found on PATH)`);
  }
  if (code === "EACCES") return new ForkdError("invalid_argument", `exec: ${program}: permission denied`);
  return new ForkdError("internal", `exec: cannot start ${program}: ${(err as Error).message}`);
}
