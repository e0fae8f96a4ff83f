/**
 * AgentClient: the controller's end of one guest agent connection (QEMU connects to the host's agent.sock and
 * the controller wraps the accepted socket). Calls are multiplexed by id; every call has a host-side deadline
 * so a silent guest cannot hang the controller; everything the guest sends is validated and bounded.
 *
 * By concern: connection.ts (calls, answers, events, hello, shutdown), exec.ts, processes.ts (`procs`),
 * files.ts (`files`), interpreter.ts (warm-up, eval, `contexts`); the small ops are here.
 */
import type { Duplex } from "node:stream";
import { invalidArgument } from "../../common/errors.js";
import { assertSandboxId } from "../../common/names.js";
import { HOSTNAME_PATTERN, MAX_ENTROPY_BYTES, MIN_ENTROPY_BYTES, type OpArgs } from "../protocol/index.js";
import { type AgentClientOptions, AgentConnection } from "./connection.js";
import { runExec } from "./exec.js";
import { agentFiles } from "./files.js";
import { agentContexts, evalCell, warmup } from "./interpreter.js";
import { agentProcesses } from "./processes.js";
import type {
  AgentContexts,
  AgentFiles,
  AgentProcesses,
  CallOptions,
  EvalOptions,
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  GuestStats,
  Hello,
  PingInfo,
  RestoreInfo,
  RestoreRequest,
  WarmupOutcome,
} from "./types.js";

export { type AgentClientLog, type AgentClientOptions, MAX_UNSENT_BYTES } from "./connection.js";
export * from "./types.js";

export class AgentClient {
  readonly files: AgentFiles;
  readonly contexts: AgentContexts;
  readonly procs: AgentProcesses;
  private readonly connection: AgentConnection;

  constructor(socket: Duplex, options: AgentClientOptions = {}) {
    this.connection = new AgentConnection(socket, options);
    this.files = agentFiles(this.connection);
    this.contexts = agentContexts(this.connection);
    this.procs = agentProcesses(this.connection);
  }

  /** The last hello the agent sent on this connection. */
  get hello(): Hello | undefined {
    return this.connection.hello;
  }

  get closed(): boolean {
    return this.connection.closed;
  }

  /** Resolves with the hello already received on this connection, or the next one. */
  waitHello(options: CallOptions = {}): Promise<Hello> {
    return this.connection.waitHello(options);
  }

  async ping(options: CallOptions = {}): Promise<PingInfo> {
    const { result: r } = await this.connection.call("ping", {}, undefined, options.signal);
    return {
      protocol: r.protocol,
      agentVersion: r.agent_version,
      template: r.template,
      interpreter: r.interpreter,
      warm: r.warm,
      sandboxId: r.sandbox_id,
      hostname: r.hostname,
      uptimeMs: r.uptime_ms,
    };
  }

  /** Memory and disk use as the guest sees them (the filesystem of `path`, default `/`). */
  async stats(options: CallOptions & { path?: string } = {}): Promise<GuestStats> {
    const args: OpArgs<"stats"> = options.path === undefined ? {} : { path: options.path };
    const { result: r } = await this.connection.call("stats", args, undefined, options.signal);
    return {
      memTotalBytes: r.mem_total_bytes,
      memAvailableBytes: r.mem_available_bytes,
      memCacheBytes: r.mem_cache_bytes,
      diskTotalBytes: r.disk_total_bytes,
      diskUsedBytes: r.disk_used_bytes,
    };
  }

  /** The post-restore fix-up: send it to every new child before anything else. Resolves once applied. */
  async restore(request: RestoreRequest, options: CallOptions = {}): Promise<RestoreInfo> {
    if (typeof request.timeNs !== "bigint" || request.timeNs < 0n || request.timeNs >= 2n ** 63n) {
      throw invalidArgument(`restore: timeNs must be a bigint in [0, 2^63), got ${String(request.timeNs)}`);
    }
    if (request.entropy.length < MIN_ENTROPY_BYTES || request.entropy.length > MAX_ENTROPY_BYTES) {
      throw invalidArgument(
        `restore: entropy must be ${MIN_ENTROPY_BYTES}..${MAX_ENTROPY_BYTES} bytes, got ${request.entropy.length}`,
      );
    }
    if (request.hostname.length > 64 || !new RegExp(HOSTNAME_PATTERN).test(request.hostname)) {
      throw invalidArgument(`restore: invalid hostname ${JSON.stringify(request.hostname)}`);
    }
    assertSandboxId(request.sandboxId);
    const args = {
      time_ns: request.timeNs.toString(),
      hostname: request.hostname,
      sandbox_id: request.sandboxId,
    };
    const { result: r } = await this.connection.call("restore", args, request.entropy, options.signal);
    return {
      applied: r.applied,
      entropyBytes: r.entropy_bytes,
      hostname: r.hostname,
      sandboxId: r.sandbox_id,
      durationMs: r.duration_ms,
    };
  }

  /** Runs the template's warm-up code in the warm interpreter; the agent records the resulting warm state. */
  warmup(code: string, options: EvalOptions = {}): Promise<WarmupOutcome> {
    return warmup(this.connection, code, options);
  }

  /** Runs a notebook-style cell in a persistent Python namespace (a context; default `default`). */
  eval(code: string, options: EvalOptions = {}): Promise<EvalOutcome> {
    return evalCell(this.connection, code, options);
  }

  /** Runs a program (argv, no shell) in the guest; output streams to the callbacks as it is produced. */
  exec(argv: string[], options: ExecOptions = {}): Promise<ExecOutcome> {
    return runExec(this.connection, argv, options);
  }

  /** Closes the connection; pending calls reject. */
  close(): void {
    this.connection.close();
  }
}
