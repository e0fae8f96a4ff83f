/**
 * The daemon's side of forkd-netd (src/net/netd/, Go): one long-running helper per daemon process that creates,
 * configures and removes sandbox namespaces over netlink and applies their nft scripts, so a sandbox's network
 * costs no `ip` process and one `nft` process instead of three or five processes.
 *
 * Protocol (declared here; the helper gets the limits in its argv and a test checks its operation names): one
 * JSON object per line each way over the helper's stdin/stdout pipes, which only this process holds; requests
 * carry an id, answers `{id, ok, error?}` in any order. Lines are at most NETD_MAX_MESSAGE_BYTES; the helper runs
 * NETD_MAX_CONCURRENT requests at once and queues the rest. The helper dies with this process (PR_SET_PDEATHSIG);
 * if it dies first, every pending request fails and the next one starts a new helper.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { packageRoot } from "../common/package-root.js";

export const NETD_OPS = ["link", "configure", "rules", "remove"] as const;
export type NetdOp = (typeof NETD_OPS)[number];
export const NETD_MAX_MESSAGE_BYTES = 1024 * 1024;
export const NETD_MAX_CONCURRENT = 8;
/** As long as TOOL_TIMEOUT_MS (commands.ts): a request only takes this long on a wedged host. */
export const NETD_REQUEST_TIMEOUT_MS = 30_000;

export interface NetdRequest {
  op: NetdOp;
  netns: string;
  veth?: string;
  peer?: string;
  bridge?: string;
  tap?: string;
  tapMac?: string;
  tapAddress?: string;
  guestIp?: string;
  guestMac?: string;
  uplink?: string;
  uplinkAddress?: string;
  defaultGateway?: string;
  sysctls?: [string, string][];
  script?: string;
}

interface Pending {
  resolve: () => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
  what: string;
}

/** $FORKD_NETD, or the binary `npm run build` puts into dist/. */
export function netdBinary(env: NodeJS.ProcessEnv = process.env): string {
  return env.FORKD_NETD ?? path.join(packageRoot(), "dist", "forkd-netd");
}

export class NetdClient {
  private child: ChildProcessWithoutNullStreams | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private buffered = "";

  constructor(private readonly binary: string = netdBinary()) {}

  /** Sends one request; resolves when the helper has done it, rejects with what stopped it. */
  request(req: NetdRequest): Promise<void> {
    const line = `${JSON.stringify({ id: this.nextId, ...req })}\n`;
    const what = `forkd-netd ${req.op} ${req.netns}`;
    if (Buffer.byteLength(line) > NETD_MAX_MESSAGE_BYTES)
      return Promise.reject(
        new ForkdError("internal", `${what}: request over ${NETD_MAX_MESSAGE_BYTES} bytes`),
      );
    const id = this.nextId++;
    const child = this.started();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new ForkdError("unavailable", `${what}: no answer in ${NETD_REQUEST_TIMEOUT_MS} ms`));
        // A wedged helper would hold every later request too: a new one serves them.
        this.stop();
      }, NETD_REQUEST_TIMEOUT_MS);
      this.pending.set(id, { resolve, reject, timer, what });
      this.setReferenced(true);
      child.stdin.write(line);
    });
  }

  /** The running helper's pid (benchmarks add its CPU to the daemon's), if one runs. */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Ends the helper (pending requests fail); the next request starts a new one. */
  stop(): void {
    const child = this.child;
    if (!child) return;
    this.child = undefined;
    child.stdin.end();
    child.kill("SIGKILL");
    this.failAll(new ForkdError("unavailable", "forkd-netd stopped"));
  }

  private started(): ChildProcessWithoutNullStreams {
    if (this.child) return this.child;
    const child = spawn(
      this.binary,
      [
        `--max-message=${NETD_MAX_MESSAGE_BYTES}`,
        `--max-concurrent=${NETD_MAX_CONCURRENT}`,
        `--parent=${process.pid}`,
      ],
      { stdio: ["pipe", "pipe", "pipe"] },
    );
    this.child = child;
    this.buffered = "";
    let stderr = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => this.onData(chunk));
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => {
      if (stderr.length < 4096) stderr += chunk.slice(0, 4096 - stderr.length);
    });
    child.stdin.on("error", () => {}); // the exit handler reports it
    const gone = (why: string) => {
      if (this.child !== child) return;
      this.child = undefined;
      const hint = /ENOENT/.test(why) ? " (npm run build builds it)" : "";
      this.failAll(
        new ForkdError("unavailable", `forkd-netd ${why}${hint}${stderr ? `: ${stderr.trim()}` : ""}`),
      );
    };
    child.on("error", (err) => gone(`could not run ${this.binary}: ${err.message}`));
    child.on("exit", (code, signal) => gone(`exited (${signal ?? code})`));
    return child;
  }

  private onData(chunk: string): void {
    this.buffered += chunk;
    if (this.buffered.length > NETD_MAX_MESSAGE_BYTES * 2) {
      this.stop();
      return;
    }
    for (let nl = this.buffered.indexOf("\n"); nl >= 0; nl = this.buffered.indexOf("\n")) {
      const line = this.buffered.slice(0, nl);
      this.buffered = this.buffered.slice(nl + 1);
      this.onAnswer(line);
    }
  }

  private onAnswer(line: string): void {
    let answer: { id?: unknown; ok?: unknown; error?: unknown };
    try {
      answer = JSON.parse(line);
    } catch {
      this.stop();
      return;
    }
    const pending = typeof answer.id === "number" ? this.pending.get(answer.id) : undefined;
    if (!pending) return;
    this.pending.delete(answer.id as number);
    clearTimeout(pending.timer);
    if (answer.ok === true) pending.resolve();
    else pending.reject(new ForkdError("unavailable", `${pending.what}: ${String(answer.error)}`));
    if (this.pending.size === 0) this.setReferenced(false);
  }

  private failAll(err: Error): void {
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      this.pending.delete(id);
      p.reject(new ForkdError("unavailable", `${p.what}: ${err.message}`, { cause: err }));
    }
  }

  /** An idle helper does not keep this process alive (it exits with it). */
  private setReferenced(ref: boolean): void {
    const child = this.child;
    if (!child) return;
    for (const handle of [child, child.stdin, child.stdout, child.stderr] as { ref(): void; unref(): void }[])
      ref ? handle.ref() : handle.unref();
  }
}

let shared: NetdClient | undefined;

/** This process's helper (started at its first request). */
export function netd(): NetdClient {
  shared ??= new NetdClient();
  return shared;
}
