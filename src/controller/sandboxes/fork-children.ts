/**
 * Fork N children from a snapshot, optionally run a command or evaluate code in each, report per-child results
 * and timings, and tear every child down. Used by `forkd fork` and the spawn benchmark.
 */
import { availableParallelism } from "node:os";
import { sleep } from "../../common/deadline.js";
import { errorMessage, invalidArgument } from "../../common/errors.js";
import { MAX_SPAWN_N } from "../../common/limits.js";
import { assertTag } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { prepareRestore } from "../machines/restore-plan.js";
import { Sandbox } from "../machines/sandbox-vm.js";
import { NO_LIMITS } from "./limits.js";
import type { WarmPool } from "./warm-pool.js";

/**
 * Children restored at once: one per core. Each restore is CPU (QEMU start, device-state load, TCG translating
 * the guest's first instructions); measured with 50 children on 2 cores, 2 in flight gave the lowest wall time
 * and CPU per child, more only added contention (+40% CPU per child, latency growing linearly).
 */
export const DEFAULT_FORK_CONCURRENCY = Math.max(1, availableParallelism());

/** Default per-child limit for --exec/--eval work, after the child is ready. */
export const DEFAULT_WORK_TIMEOUT_MS = 60_000;

export interface ForkOptions {
  tag: string;
  n: number;
  exec?: string[];
  eval?: string;
  concurrency?: number;
  workTimeoutMs?: number;
  signal?: AbortSignal;
  /** Called as each child finishes its work (or fails), in completion order. */
  onChild?: (child: ChildResult) => void;
  /** Called with every live child after all have answered, before teardown (benchmarks measure memory here). */
  inspect?: (live: readonly Sandbox[]) => Promise<void>;
  /**
   * Keep the children running this long after all have answered, before teardown (forkd v0.5's
   * `--settle-secs`); `signal` ends the wait early, and the children are torn down as usual.
   */
  settleMs?: number;
  /** Take prestarted VMs of `tag` from this pool while it has them; the rest start cold. */
  pool?: WarmPool;
  /** Called after a child's work, while it is alive (benchmarks read its CPU time here). */
  afterWork?: (sandbox: Sandbox, child: ChildResult) => Promise<void>;
}

export interface ChildResult {
  index: number;
  id: string | null;
  ready_ms: number | null;
  /** Exit code of --exec; for --eval alone 0 when it raised nothing, 1 when it raised. */
  exit_code: number | null;
  stdout: string;
  stderr: string;
  /** repr() of the --eval value. */
  result: string | null;
  error: string | null;
  /** Time from the start of the fork to this child's answer. */
  done_ms: number;
}

export interface ForkResult {
  accelerator: "kvm" | "tcg";
  tag: string;
  n: number;
  wall_ms: number;
  children: ChildResult[];
  /** With `settleMs`: how long the children were kept running, and how many were still alive at the end. */
  settle?: { ms: number; alive: number };
}

export function validateChildCount(n: unknown): number {
  if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > MAX_SPAWN_N) {
    throw invalidArgument(`n must be an integer in 1..${MAX_SPAWN_N}, got ${JSON.stringify(n)}`);
  }
  return n;
}

export async function forkChildren(paths: ForkdPaths, options: ForkOptions): Promise<ForkResult> {
  const tag = assertTag(options.tag);
  const n = validateChildCount(options.n);
  if (options.exec !== undefined && options.exec.length === 0)
    throw invalidArgument("--exec needs a command");
  const concurrency = Math.max(1, Math.min(options.concurrency ?? DEFAULT_FORK_CONCURRENCY, n));
  const plan = await prepareRestore(paths, tag);
  const { snapshot } = plan;
  const abort = new AbortController();
  const signal = options.signal ? AbortSignal.any([options.signal, abort.signal]) : abort.signal;

  const started = performance.now();
  const children: ChildResult[] = new Array(n);
  const live = new Set<Sandbox>();
  let next = 0;
  const worker = async () => {
    while (next < n && !signal.aborted) {
      const index = next++;
      const child = await runChild(index);
      children[index] = child;
      options.onChild?.(child);
    }
  };
  const runChild = (index: number) => forkChild({ paths, tag, plan, options, signal, live, started }, index);

  try {
    // allSettled, not all: on Ctrl-C every worker's restore must finish its own cleanup (kill its QEMU, remove
    // its run directory) before this returns and the program exits.
    const settled = await Promise.allSettled(Array.from({ length: concurrency }, worker));
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed) throw failed.reason;
    options.signal?.throwIfAborted();
    const wallMs = performance.now() - started;
    await options.inspect?.([...live]);
    const settle = options.settleMs === undefined ? undefined : await settleChildren(live, options);
    return {
      accelerator: snapshot.manifest.machine.accel,
      tag,
      n,
      wall_ms: round1(wallMs),
      children,
      ...(settle ? { settle } : {}),
    };
  } finally {
    abort.abort();
    await Promise.all([...live].map((s) => s.destroy()));
    await plan.dispose();
  }
}

/** What every child of one fork shares. */
interface ForkRun {
  paths: ForkdPaths;
  tag: string;
  plan: Awaited<ReturnType<typeof prepareRestore>>;
  options: ForkOptions;
  signal: AbortSignal;
  /** The children alive now (torn down at the end). */
  live: Set<Sandbox>;
  started: number;
}

/** Restores child `index` (from the pool when it has one), runs its work; its failure is its result's error. */
async function forkChild(run: ForkRun, index: number): Promise<ChildResult> {
  const { options, signal } = run;
  const result: ChildResult = {
    index,
    id: null,
    ready_ms: null,
    exit_code: null,
    stdout: "",
    stderr: "",
    result: null,
    error: null,
    done_ms: 0,
  };
  let sandbox: Sandbox | undefined;
  try {
    // In-process forks run without cgroups or limits, like the pool that serves them.
    const pooled = options.pool?.take(run.tag, 1, NO_LIMITS);
    sandbox = await Sandbox.restore(run.paths, pooled?.plan ?? run.plan, {
      signal,
      prestarted: pooled?.children[0],
    });
    run.live.add(sandbox);
    result.id = sandbox.id;
    result.ready_ms = round1(sandbox.readyMs);
    await runWork(sandbox, options, result, signal);
    await options.afterWork?.(sandbox, result);
  } catch (err) {
    if (signal.aborted && options.signal?.aborted) throw err;
    result.error = errorMessage(err);
  } finally {
    result.done_ms = round1(performance.now() - run.started);
  }
  return result;
}

/** Waits `settleMs` (or until `signal`), then counts the children whose VM still runs. */
async function settleChildren(
  live: Set<Sandbox>,
  options: ForkOptions,
): Promise<{ ms: number; alive: number }> {
  let exited = 0;
  for (const sandbox of live) void sandbox.vm.exited.then(() => exited++);
  const started = performance.now();
  await sleep(options.settleMs ?? 0, options.signal).catch(() => {});
  return { ms: round1(performance.now() - started), alive: live.size - exited };
}

async function runWork(
  sandbox: Sandbox,
  options: ForkOptions,
  out: ChildResult,
  signal: AbortSignal,
): Promise<void> {
  const timeoutMs = options.workTimeoutMs ?? DEFAULT_WORK_TIMEOUT_MS;
  if (options.exec) {
    const ran = await sandbox.agent.exec(options.exec, { timeoutMs, signal });
    out.exit_code = ran.exitCode;
    out.stdout += ran.stdout.toString("utf8");
    out.stderr += ran.stderr.toString("utf8");
    if (ran.timedOut) out.error = `command timed out after ${timeoutMs} ms`;
  }
  if (options.eval !== undefined) {
    const evaluated = await sandbox.agent.eval(options.eval, { timeoutMs, signal });
    out.stdout += evaluated.stdout;
    out.stderr += evaluated.stderr;
    out.result = evaluated.result;
    if (evaluated.error) {
      out.error = `${evaluated.error.type}: ${evaluated.error.message}`;
      out.exit_code = 1;
    } else if (out.exit_code === null) {
      out.exit_code = 0;
    }
  }
  if (!options.exec && options.eval === undefined) out.exit_code = null;
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}

export function failedChildren(result: ForkResult): ChildResult[] {
  return result.children.filter((c) => c.error !== null || (c.exit_code !== null && c.exit_code !== 0));
}
