/**
 * Controller: the daemon's REST API as methods, with forkd v0.5's method set and option names (camelCase in,
 * the wire's JSON documents out). The Sandbox class builds on it. Every method takes per-call options
 * (`requestTimeoutMs`, `signal`, `token`, `headers`) that override the client's.
 */
import { createReadStream } from "node:fs";
import { type FileHandle, open, rm, stat } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { CallScope } from "./call-scope.js";
import { ForkdSdkError, InvalidArgumentError } from "./errors.js";
import { type ExecEvent, execEvents } from "./exec-stream.js";
import {
  type ConnectionOptions,
  checkDurationMs,
  DEFAULT_COMMAND_TIMEOUT_MS,
  type RequestOptions,
  type ResolvedSettings,
  resolveSettings,
} from "./settings.js";
import {
  exchange,
  type HttpRequest,
  isDaemonReachable,
  openStream,
  pathOf,
  streamFailure,
} from "./transport.js";
import type {
  BranchResult,
  EgressPolicyWire,
  EvalResult,
  ExecResult,
  FileInfo,
  FileListing,
  NetworkStatus,
  PauseResult,
  PingResult,
  SandboxInfo,
  SandboxStatus,
  SnapshotDetail,
  SnapshotInfo,
  UnpackResult,
  VersionInfo,
} from "./wire.js";

/** Building an image, booting and warming a parent takes minutes under TCG. */
export const DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS = 30 * 60_000;
/** Network allowance on top of a command's own timeout, for calls that wait for guest work. */
const GUEST_WORK_GRACE_MS = 10_000;
/** Deadline allowance per child of a spawn request, on top of `requestTimeoutMs`. */
export const SPAWN_MS_PER_CHILD = 1_000;
/** Stdin bytes per NDJSON frame of a streamed-stdin exec (the daemon bounds one request line). */
const STDIN_FRAME_BYTES = 256 * 1024;
/** The daemon's longest guest-side timeout; "no limit" (0) is sent as this, since the wire needs a bound. */
export const MAX_GUEST_TIMEOUT_MS = 24 * 60 * 60 * 1000;

/** An egress policy (camelCase, as in E2B's `network` option; see docs/network.md). */
export interface NetworkPolicy {
  /**
   * Destinations no entry names: "allow" or "deny". A field left out comes from the snapshot's template default
   * (`[egress]`, docs/templates.md). @default the template's, else the daemon's --egress
   */
  egress?: "allow" | "deny";
  /** IPv4 addresses, CIDRs, domain names, *.domain wildcards; an allow entry wins over a deny entry. */
  allowOut?: string[];
  /** Same forms; "0.0.0.0/0" means egress "deny". */
  denyOut?: string[];
}

function policyToWire(policy: NetworkPolicy | "none"): EgressPolicyWire | "none" {
  if (policy === "none") return "none";
  const wire: EgressPolicyWire = {};
  if (policy.egress !== undefined) wire.egress = policy.egress;
  if (policy.allowOut !== undefined) wire.allow_out = policy.allowOut;
  if (policy.denyOut !== undefined) wire.deny_out = policy.denyOut;
  return wire;
}

export interface SpawnOptions extends RequestOptions {
  snapshotTag: string;
  /** How many children (1..1000), all or none. The call waits `requestTimeoutMs` + 1 s per child. @default 1 */
  n?: number;
  /**
   * Limits per sandbox (docs/security.md, Limits); absent: the daemon's defaults (memory = guest RAM + 256 MiB,
   * one CPU per vCPU, 128 tasks, its --disk-limit-mib). One the daemon's host cannot enforce is a 501.
   */
  memoryLimitMib?: number;
  /** CPU bandwidth in thousandths of a CPU (500 = half a CPU). */
  cpuLimitMillicores?: number;
  /** Processes and threads of the sandbox's QEMU. */
  pidsLimit?: number;
  /** Largest size of the sandbox's writable disk layer. */
  diskLimitMib?: number;
  /**
   * Each sandbox's lifetime in ms, counted from spawn; 0 = no limit. @default the daemon's: none (it lives
   * until killed) unless the daemon runs with `--default-timeout-ms`. `Sandbox.create` sends 5 minutes.
   */
  timeoutMs?: number;
  /**
   * Egress policy, or "none" (the sandbox's NIC leads nowhere). @default the snapshot's template default
   * (`[egress]`), else the daemon's --egress. Domain entries
   * work through the sandbox's DNS; other sandboxes, the host and the daemon are never reachable.
   */
  network?: NetworkPolicy | "none";
  /** What the end of the lifetime does: kill the sandbox, or pause it to disk (resume it later). @default "kill" */
  onTimeout?: "kill" | "pause";
  /** forkd v0.5 flags, sent only when given; the daemon answers 501 for features it has not built. */
  perChildNetns?: boolean;
  prewarm?: boolean;
  liveFork?: boolean;
  hugepages?: boolean;
}

export interface ExecCommandOptions extends RequestOptions {
  /** Kill the command after this many ms; 0 = no limit (the daemon's maximum, 24 h). @default 60_000 */
  timeoutMs?: number;
  /** forkd v0.5 spelling of the command timeout, in seconds; `timeoutMs` wins if both are given. */
  timeoutSecs?: number;
  envs?: Record<string, string>;
  /** Absolute working directory in the guest. @default / */
  cwd?: string;
  /** Written to the command's stdin, which is then closed. */
  stdin?: string | Uint8Array;
  /** How `execCommand` puts output bytes in its JSON strings. @default "utf8" (invalid bytes replaced) */
  encoding?: "utf8" | "base64";
}

export interface ExecStreamOptions extends Omit<ExecCommandOptions, "stdin" | "encoding"> {
  /** Stdin as a whole, or streamed while the command runs (closed when the iterable ends). */
  stdin?: string | Uint8Array | AsyncIterable<string | Uint8Array>;
}

export interface EvalCodeOptions extends RequestOptions {
  /** Kill the evaluation after this many ms; 0 = no limit. @default 60_000 */
  timeoutMs?: number;
}

export interface BranchOptions extends RequestOptions {
  tag?: string;
  /**
   * `full`: a snapshot that stands alone (flat memory, one disk layer, no parent); `diff`: only what the sandbox
   * changed, on top of its base (a chain); `live`: like diff, memory captured while the sandbox runs (needs
   * `liveFork` at spawn). @default the daemon's: "full" (as forkd v0.5)
   */
  mode?: "full" | "diff" | "live";
  /** Wait until the snapshot is ready (live mode may return while it is still `writing`). @default true */
  wait?: boolean;
  /** forkd v0.5 forms of `mode`. */
  diff?: boolean;
  live?: boolean;
  /** Report forkd v0.5's `diff_ms` / `diff_*_bytes` (mode diff always does). */
  measureDiff?: boolean;
  /** forkd v0.5: the parent the caller expects (the sandbox's base); a mismatch is a ConflictError. */
  parentTag?: string;
}

export interface CreateSnapshotOptions extends RequestOptions {
  tag: string;
  /** Template name (templates/<name>.toml on the daemon's host). @default the tag */
  template?: string;
  /**
   * forkd v0.5's form instead of `template`: the kernel and root filesystem of a built forkd image on the
   * daemon's host (its vmlinuz and rootfs.ext4, in an allowed image directory; anything else is refused with
   * InvalidArgumentError naming the directories).
   */
  kernel?: string;
  rootfs?: string;
  /**
   * Longest wait for the build, boot and warm-up in ms; 0 = no limit. Replaces `requestTimeoutMs` for this call.
   * @default 1_800_000 (30 minutes)
   */
  timeoutMs?: number;
}

export interface ReadFileOptions extends RequestOptions {
  /** Refuse files larger than this many bytes. */
  maxBytes?: number;
}

export interface WriteFileOptions extends RequestOptions {
  /** Permission bits of a new file, e.g. 0o755. */
  mode?: number;
}

export class Controller {
  readonly options: ConnectionOptions;

  constructor(options: ConnectionOptions = {}) {
    this.options = { ...options };
    // Resolve once now so a bad FORKD_URL or token fails at construction, not at the first call.
    resolveSettings(this.options);
  }

  /** The settings one call would use (per call → client → environment → default). */
  settings(call: RequestOptions = {}): ResolvedSettings {
    return resolveSettings(this.options, call);
  }

  // --- daemon ------------------------------------------------------------------------------------------

  /** true if the daemon answers GET /healthz; never throws. */
  async isReachable(call: RequestOptions = {}): Promise<boolean> {
    return isDaemonReachable(this.settings(call));
  }

  async version(call: RequestOptions = {}): Promise<VersionInfo> {
    return this.json<VersionInfo>({ method: "GET", path: "/version" }, call);
  }

  // --- snapshots ---------------------------------------------------------------------------------------

  async listSnapshots(call: RequestOptions = {}): Promise<SnapshotInfo[]> {
    return this.json<SnapshotInfo[]>({ method: "GET", path: "/v1/snapshots" }, call);
  }

  /** One snapshot, with its chain (`chain_depth`, `ancestors`, `dependents`). */
  async getSnapshot(tag: string, call: RequestOptions = {}): Promise<SnapshotDetail> {
    return this.json<SnapshotDetail>(
      { method: "GET", path: pathOf`/v1/snapshots/${required(tag, "tag")}/info` },
      call,
    );
  }

  /** Builds the template's image if needed, boots, warms and snapshots a parent; resolves when it is ready. */
  async createSnapshot(options: CreateSnapshotOptions): Promise<SnapshotInfo> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS;
    checkDurationMs(timeoutMs, "timeoutMs");
    return this.json<SnapshotInfo>(
      {
        method: "POST",
        path: "/v1/snapshots",
        json: {
          tag: required(options.tag, "tag"),
          ...(options.template === undefined ? {} : { template: required(options.template, "template") }),
          ...(options.kernel === undefined ? {} : { kernel: required(options.kernel, "kernel") }),
          ...(options.rootfs === undefined ? {} : { rootfs: required(options.rootfs, "rootfs") }),
        },
        deadlineMs: timeoutMs,
        deadlineSetting: "timeoutMs",
      },
      options,
    );
  }

  /**
   * Deletes a snapshot. ConflictError if a sandbox uses it, or if other snapshots depend on it and neither
   * `cascade` (delete them too) nor `force` (leave them orphaned) is set.
   */
  async deleteSnapshot(
    tag: string,
    options: RequestOptions & { cascade?: boolean; force?: boolean } = {},
  ): Promise<void> {
    const query: Record<string, boolean> = {};
    if (options.cascade) query.cascade = true;
    if (options.force) query.force = true;
    await this.send(
      { method: "DELETE", path: pathOf`/v1/snapshots/${required(tag, "tag")}`, query },
      options,
    );
  }

  /** Folds the chain ending at `tag` into a new flat snapshot `to` (no parent); resolves when it is ready. */
  async compactSnapshot(
    tag: string,
    to: string,
    options: RequestOptions & { timeoutMs?: number } = {},
  ): Promise<SnapshotInfo> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS;
    checkDurationMs(timeoutMs, "timeoutMs");
    return this.json<SnapshotInfo>(
      {
        method: "POST",
        path: pathOf`/v1/snapshots/${required(tag, "tag")}/compact`,
        json: { to: required(to, "to") },
        deadlineMs: timeoutMs,
        deadlineSetting: "timeoutMs",
      },
      options,
    );
  }

  // --- sandboxes ---------------------------------------------------------------------------------------

  /** Forks `n` children of a snapshot. */
  async spawnSandboxes(options: SpawnOptions): Promise<SandboxInfo[]> {
    const body: Record<string, unknown> = {
      snapshot_tag: required(options.snapshotTag, "snapshotTag"),
      n: options.n ?? 1,
    };
    if (options.memoryLimitMib !== undefined) body.memory_limit_mib = options.memoryLimitMib;
    if (options.cpuLimitMillicores !== undefined) body.cpu_limit_millicores = options.cpuLimitMillicores;
    if (options.pidsLimit !== undefined) body.pids_limit = options.pidsLimit;
    if (options.diskLimitMib !== undefined) body.disk_limit_mib = options.diskLimitMib;
    if (options.timeoutMs !== undefined) {
      checkDurationMs(options.timeoutMs, "timeoutMs");
      body.timeout_ms = options.timeoutMs;
    }
    if (options.network !== undefined) body.network = policyToWire(options.network);
    if (options.onTimeout !== undefined) body.on_timeout = options.onTimeout;
    if (options.perChildNetns !== undefined) body.per_child_netns = options.perChildNetns;
    if (options.prewarm !== undefined) body.prewarm = options.prewarm;
    if (options.liveFork !== undefined) body.live_fork = options.liveFork;
    if (options.hugepages !== undefined) body.hugepages = options.hugepages;
    const n = body.n as number;
    const requestTimeoutMs = this.settings(options).requestTimeoutMs;
    return this.json<SandboxInfo[]>(
      {
        method: "POST",
        path: "/v1/sandboxes",
        json: body,
        // Children are restored in parallel but the host's CPUs bound how many at once: a fan-out of 100 takes
        // about a minute under TCG, so the deadline grows with n.
        deadlineMs: requestTimeoutMs === 0 ? 0 : requestTimeoutMs + n * SPAWN_MS_PER_CHILD,
        deadlineWhat: `spawning ${n} sandbox${n === 1 ? "" : "es"} (requestTimeoutMs + ${SPAWN_MS_PER_CHILD} ms per child)`,
      },
      options,
    );
  }

  async listSandboxes(
    options: RequestOptions & { snapshotTag?: string; status?: SandboxStatus } = {},
  ): Promise<SandboxInfo[]> {
    const query: Record<string, string> = {};
    if (options.snapshotTag !== undefined) query.snapshot_tag = options.snapshotTag;
    if (options.status !== undefined) query.status = options.status;
    return this.json<SandboxInfo[]>({ method: "GET", path: "/v1/sandboxes", query }, options);
  }

  async getSandbox(id: string, call: RequestOptions = {}): Promise<SandboxInfo> {
    return this.json<SandboxInfo>({ method: "GET", path: pathOf`/v1/sandboxes/${required(id, "id")}` }, call);
  }

  /** Kills every sandbox (`all: true`) or every sandbox of one snapshot; returns the ids killed. */
  async killSandboxes(
    options: RequestOptions & ({ all: true } | { snapshotTag: string }),
  ): Promise<string[]> {
    const query = "snapshotTag" in options ? { snapshot_tag: options.snapshotTag } : { all: true };
    const answer = await this.json<{ killed: string[] }>(
      { method: "DELETE", path: "/v1/sandboxes", query },
      options,
    );
    return answer.killed;
  }

  /** Kills the sandbox and frees its resources; NotFoundError if the daemon does not know it. */
  async killSandbox(id: string, call: RequestOptions = {}): Promise<void> {
    await this.send({ method: "DELETE", path: pathOf`/v1/sandboxes/${required(id, "id")}` }, call);
  }

  /** Sets the sandbox's remaining lifetime to `timeoutMs` from now (0 = no limit). */
  async setSandboxTimeout(id: string, timeoutMs: number, call: RequestOptions = {}): Promise<SandboxInfo> {
    checkDurationMs(timeoutMs, "timeoutMs");
    return this.json<SandboxInfo>(
      {
        method: "POST",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/timeout`,
        json: { timeout_ms: timeoutMs },
      },
      call,
    );
  }

  /**
   * Pauses a running sandbox: its memory, processes and files into a snapshot layer, its VM stopped, its RAM
   * given back; it keeps its id, network and policy. ConflictError unless it is running. `merge`: write one
   * layer holding everything since its snapshot (the daemon also merges by itself when the chain gets deep).
   */
  async pauseSandbox(id: string, options: RequestOptions & { merge?: boolean } = {}): Promise<PauseResult> {
    return this.json<PauseResult>(
      {
        method: "POST",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/pause`,
        json: options.merge === undefined ? {} : { merge: options.merge },
      },
      options,
    );
  }

  /**
   * Resumes a paused sandbox under the same id, where it was. Its lifetime starts again: `timeoutMs` from now
   * (0 = no limit), else the one it had. ConflictError unless it is paused.
   */
  async resumeSandbox(
    id: string,
    options: RequestOptions & { timeoutMs?: number } = {},
  ): Promise<SandboxInfo> {
    if (options.timeoutMs !== undefined) checkDurationMs(options.timeoutMs, "timeoutMs");
    return this.json<SandboxInfo>(
      {
        method: "POST",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/resume`,
        json: options.timeoutMs === undefined ? {} : { timeout_ms: options.timeoutMs },
      },
      options,
    );
  }

  /** How the daemon networks sandboxes (mode, bridge, DNS forwarder, default egress). */
  async networkStatus(call: RequestOptions = {}): Promise<NetworkStatus> {
    return this.json<NetworkStatus>({ method: "GET", path: "/v1/network" }, call);
  }

  /**
   * Replaces a running sandbox's egress policy (E2B's updateNetwork): new connections follow it at once,
   * established ones at their next packet. ConflictError for a sandbox without a network of its own.
   */
  async setNetworkPolicy(id: string, policy: NetworkPolicy, call: RequestOptions = {}): Promise<SandboxInfo> {
    return this.json<SandboxInfo>(
      {
        method: "PUT",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/network`,
        json: policyToWire(policy),
      },
      call,
    );
  }

  async pingSandbox(id: string, call: RequestOptions = {}): Promise<PingResult> {
    return this.json<PingResult>(
      { method: "POST", path: pathOf`/v1/sandboxes/${required(id, "id")}/ping` },
      call,
    );
  }

  /** Runs `args` (no shell) and returns its whole output once it exits. For streamed output use `execStream`. */
  async execCommand(id: string, args: string[], options: ExecCommandOptions = {}): Promise<ExecResult> {
    const timeoutMs = commandTimeoutMs(options);
    return this.json<ExecResult>(
      {
        method: "POST",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/exec`,
        json: {
          ...execBody(args, options, timeoutMs),
          ...(options.encoding ? { encoding: options.encoding } : {}),
        },
        ...this.guestWorkDeadline(timeoutMs, options),
      },
      options,
    );
  }

  /**
   * Runs `args` (no shell) and yields its output as it happens, then its exit (`type: "exit"`). The request
   * timeout bounds the wait for the daemon to start the command; `timeoutMs` bounds the command.
   * Breaking out of the loop or aborting `signal` disconnects, which kills the command.
   */
  async *execStream(id: string, args: string[], options: ExecStreamOptions = {}): AsyncGenerator<ExecEvent> {
    const timeoutMs = commandTimeoutMs(options);
    const settings = this.settings(options);
    const { stdin, ...rest } = options;
    const exec = { ...execBody(args, rest, timeoutMs), encoding: "base64" };
    const path = pathOf`/v1/sandboxes/${required(id, "id")}/exec/stream`;
    const streamedStdin = stdin !== undefined && typeof stdin !== "string" && !(stdin instanceof Uint8Array);
    const request: HttpRequest = streamedStdin
      ? {
          method: "POST",
          path,
          bodyStream: stdinFrames(exec, stdin),
          contentType: "application/x-ndjson",
          accept: "application/x-ndjson",
        }
      : { method: "POST", path, json: { ...exec, ...inlineStdin(stdin) }, accept: "application/x-ndjson" };
    const scope = new CallScope(options.signal);
    let completed = false;
    try {
      const program = args[0] ?? "";
      const stopHandshakeDeadline = scope.deadline(
        settings.requestTimeoutMs,
        "requestTimeoutMs",
        `starting ${program}`,
      );
      const response = await openStream(settings, request, scope);
      stopHandshakeDeadline();
      // The daemon kills the command at timeoutMs and reports it; this backstop catches a daemon that never does.
      if (timeoutMs !== 0) scope.deadline(timeoutMs + GUEST_WORK_GRACE_MS, "timeoutMs", `command ${program}`);
      yield* execEvents(response, settings, request, scope);
      completed = true;
    } finally {
      // Leaving early (break, a throwing callback) closes the connection, which kills the command.
      if (!completed) scope.abort();
      scope.dispose();
    }
  }

  /** Evaluates Python in the sandbox's warm interpreter. */
  async evalCode(id: string, code: string, options: EvalCodeOptions = {}): Promise<EvalResult> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    checkDurationMs(timeoutMs, "timeoutMs");
    if (typeof code !== "string") throw new InvalidArgumentError("code must be a string of Python source");
    return this.json<EvalResult>(
      {
        method: "POST",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/eval`,
        json: { code, timeout_ms: wireTimeoutMs(timeoutMs) },
        ...this.guestWorkDeadline(timeoutMs, options),
      },
      options,
    );
  }

  /** BRANCH: snapshots a running sandbox mid-work; it keeps running. Spawn from the result's `tag`. */
  async branchSandbox(id: string, options: BranchOptions = {}): Promise<BranchResult> {
    const body: Record<string, unknown> = {};
    if (options.tag !== undefined) body.tag = options.tag;
    if (options.mode !== undefined) body.mode = options.mode;
    if (options.wait !== undefined) body.wait = options.wait;
    if (options.diff !== undefined) body.diff = options.diff;
    if (options.live !== undefined) body.live = options.live;
    if (options.measureDiff !== undefined) body.measure_diff = options.measureDiff;
    if (options.parentTag !== undefined) body.parent_tag = options.parentTag;
    return this.json<BranchResult>(
      { method: "POST", path: pathOf`/v1/sandboxes/${required(id, "id")}/branch`, json: body },
      options,
    );
  }

  /**
   * Downloads a pack of the chain ending at `tag` (and its guest image, unless `withoutImage`) into the file `out`,
   * which must not exist; `forkd unpack` or `unpackSnapshot` installs it elsewhere. A failed download leaves no file.
   */
  async packSnapshot(
    tag: string,
    options: RequestOptions & { out: string; withoutImage?: boolean; level?: number; timeoutMs?: number },
  ): Promise<{ out: string; bytes: number; chain: string[] }> {
    const out = required(options.out, "out");
    const timeoutMs = options.timeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS;
    checkDurationMs(timeoutMs, "timeoutMs");
    const settings = this.settings(options);
    const scope = new CallScope(options.signal);
    scope.deadline(timeoutMs, "timeoutMs", `packing ${tag}`);
    const query: Record<string, string | number | boolean> = {};
    if (options.withoutImage) query.without_image = true;
    if (options.level !== undefined) query.level = options.level;
    const request: HttpRequest = {
      method: "GET",
      path: pathOf`/v1/snapshots/${required(tag, "tag")}/pack`,
      query,
      accept: "application/zstd",
    };
    let file: FileHandle;
    try {
      file = await open(out, "wx", 0o600);
    } catch (err) {
      scope.dispose();
      throw new InvalidArgumentError(
        `cannot write the pack to ${out}: ${(err as NodeJS.ErrnoException).code}`,
      );
    }
    let bytes = 0;
    try {
      const response = await openStream(settings, request, scope);
      try {
        for await (const chunk of response as AsyncIterable<Buffer>) {
          bytes += chunk.length;
          await file.write(chunk);
        }
      } catch (err) {
        throw await streamFailure(settings, request, scope, err);
      }
      if (!response.complete) {
        throw await streamFailure(settings, request, scope, new Error("the pack ended early"));
      }
      await file.close();
      const chain = String(response.headers["x-forkd-pack-chain"] ?? "")
        .split(",")
        .filter(Boolean);
      return { out, bytes, chain };
    } catch (err) {
      await file.close().catch(() => {});
      await rm(out, { force: true });
      throw err;
    } finally {
      scope.dispose();
    }
  }

  /**
   * Sends the pack in `file` to the daemon, which verifies every entry and installs its snapshots, all or none
   * (`tag`: the head's new tag; `force`: replace same-tagged snapshots that differ).
   */
  async unpackSnapshot(
    file: string,
    options: RequestOptions & { tag?: string; force?: boolean; timeoutMs?: number } = {},
  ): Promise<UnpackResult> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS;
    checkDurationMs(timeoutMs, "timeoutMs");
    await stat(required(file, "file")).catch((err: NodeJS.ErrnoException) => {
      throw new InvalidArgumentError(`cannot read the pack ${file}: ${err.code}`);
    });
    const query: Record<string, string | boolean> = {};
    if (options.tag !== undefined) query.tag = options.tag;
    if (options.force) query.force = true;
    return this.json<UnpackResult>(
      {
        method: "POST",
        path: "/v1/snapshots/unpack",
        query,
        bodyStream: createReadStream(file) as AsyncIterable<Buffer>,
        contentType: "application/zstd",
        deadlineMs: timeoutMs,
        deadlineSetting: "timeoutMs",
      },
      options,
    );
  }

  /**
   * Layers a new snapshot `tag` on `from` by running `exec` in a fresh sandbox (a shell string runs under
   * `sh -c`; an array runs as argv); the daemon BRANCHes it in diff mode and kills the sandbox. A failing command
   * rejects with InvalidArgumentError (HTTP 422) carrying its output in the message.
   */
  async snapshotDiff(
    from: string,
    options: RequestOptions & { tag: string; exec: string | string[]; execTimeoutMs?: number },
  ): Promise<SnapshotInfo & { exit_code: number; stdout: string; stderr: string }> {
    const body: Record<string, unknown> = { tag: required(options.tag, "tag"), exec: options.exec };
    if (options.execTimeoutMs !== undefined) {
      checkDurationMs(options.execTimeoutMs, "execTimeoutMs");
      body.timeout_ms = options.execTimeoutMs;
    }
    return this.json(
      {
        method: "POST",
        path: pathOf`/v1/snapshots/${required(from, "from")}/diff`,
        json: body,
        deadlineMs: 0,
      },
      options,
    );
  }

  // --- files -------------------------------------------------------------------------------------------

  /** Replaces (or creates) a file, creating parent directories. Binary-safe; at most ~16 MiB per call (413). */
  async writeFile(
    id: string,
    path: string,
    data: Uint8Array | string,
    options: WriteFileOptions = {},
  ): Promise<{ bytes: number }> {
    const query: Record<string, string | number> = { path: required(path, "path") };
    if (options.mode !== undefined) query.mode = options.mode.toString(8);
    return this.json<{ path: string; bytes: number }>(
      { method: "PUT", path: pathOf`/v1/sandboxes/${required(id, "id")}/files`, query, body: data },
      options,
    );
  }

  /** A file's bytes (PayloadTooLargeError past the daemon's per-call limit, ~16 MiB, or past `maxBytes`). */
  async readFile(id: string, path: string, options: ReadFileOptions = {}): Promise<Buffer> {
    const response = await this.send(
      {
        method: "GET",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/files`,
        query: { path: required(path, "path") },
        accept: "application/octet-stream",
        maxResponseBytes: options.maxBytes,
      },
      options,
    );
    return response.body;
  }

  async listFiles(id: string, path: string, call: RequestOptions = {}): Promise<FileListing> {
    return this.json<FileListing>(
      {
        method: "GET",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/files/list`,
        query: { path: required(path, "path") },
      },
      call,
    );
  }

  async statFile(id: string, path: string, call: RequestOptions = {}): Promise<FileInfo> {
    return this.json<FileInfo>(
      {
        method: "GET",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/files/stat`,
        query: { path: required(path, "path") },
      },
      call,
    );
  }

  async removeFile(
    id: string,
    path: string,
    options: RequestOptions & { recursive?: boolean } = {},
  ): Promise<void> {
    const query: Record<string, string | boolean> = { path: required(path, "path") };
    if (options.recursive) query.recursive = true;
    await this.send(
      { method: "DELETE", path: pathOf`/v1/sandboxes/${required(id, "id")}/files`, query },
      options,
    );
  }

  // --- plumbing ----------------------------------------------------------------------------------------

  /** Sends a request and returns the buffered answer. */
  async send(request: HttpRequest, call: RequestOptions = {}) {
    const settings = this.settings(call);
    const scope = new CallScope(call.signal);
    try {
      return await exchange(settings, request, scope);
    } finally {
      scope.dispose();
    }
  }

  /**
   * Sends a request and returns the open response once its headers arrived (a non-2xx answer throws), for
   * streamed routes this SDK has no method for; read it with `parseNdjson`/`parseSse` or as bytes. The
   * request timeout bounds the wait for the headers only; `call.signal` ends the stream.
   */
  async stream(request: HttpRequest, call: RequestOptions = {}): Promise<IncomingMessage> {
    const settings = this.settings(call);
    const scope = new CallScope(call.signal);
    const clear = scope.deadline(
      request.deadlineMs ?? settings.requestTimeoutMs,
      request.deadlineSetting ?? "requestTimeoutMs",
      request.deadlineWhat ?? `${request.method} ${request.path}`,
    );
    try {
      const response = await openStream(settings, request, scope);
      response.once("close", () => scope.dispose());
      return response;
    } catch (err) {
      scope.dispose();
      throw err;
    } finally {
      clear();
    }
  }

  /** Sends a request and parses its JSON answer (null for an empty body, e.g. 204). */
  async json<T>(request: HttpRequest, call: RequestOptions = {}): Promise<T> {
    const response = await this.send(request, call);
    if (response.body.length === 0) return null as T;
    try {
      return JSON.parse(response.body.toString("utf8")) as T;
    } catch {
      throw new ForkdSdkError(
        `the daemon answered ${request.method} ${request.path} with a body that is not JSON (is FORKD_URL pointing at forkd?)`,
      );
    }
  }

  /** A call that waits on guest work gets the work's timeout plus the request timeout as its deadline. */
  private guestWorkDeadline(
    timeoutMs: number,
    call: RequestOptions,
  ): Pick<HttpRequest, "deadlineMs" | "deadlineSetting"> {
    const requestTimeoutMs = this.settings(call).requestTimeoutMs;
    if (timeoutMs === 0 || requestTimeoutMs === 0) return { deadlineMs: 0 };
    return { deadlineMs: timeoutMs + requestTimeoutMs, deadlineSetting: "timeoutMs" };
  }
}

function commandTimeoutMs(options: Pick<ExecCommandOptions, "timeoutMs" | "timeoutSecs">): number {
  const timeoutMs =
    options.timeoutMs ??
    (options.timeoutSecs === undefined ? DEFAULT_COMMAND_TIMEOUT_MS : options.timeoutSecs * 1000);
  checkDurationMs(
    timeoutMs,
    options.timeoutMs === undefined && options.timeoutSecs !== undefined ? "timeoutSecs*1000" : "timeoutMs",
  );
  return timeoutMs;
}

/** "No limit" (0) becomes the daemon's longest timeout: the wire requires a bound. */
function wireTimeoutMs(timeoutMs: number): number {
  return timeoutMs === 0 ? MAX_GUEST_TIMEOUT_MS : timeoutMs;
}

function execBody(
  args: string[],
  options: Pick<ExecCommandOptions, "envs" | "cwd" | "stdin">,
  timeoutMs: number,
): Record<string, unknown> {
  if (!Array.isArray(args) || args.length === 0 || args.some((a) => typeof a !== "string")) {
    throw new InvalidArgumentError(
      "args must be a non-empty array of strings (the program and its arguments)",
    );
  }
  const body: Record<string, unknown> = { args, timeout_ms: wireTimeoutMs(timeoutMs) };
  if (options.envs !== undefined) body.env = options.envs;
  if (options.cwd !== undefined) body.cwd = options.cwd;
  return { ...body, ...inlineStdin(options.stdin) };
}

function inlineStdin(
  stdin: string | Uint8Array | AsyncIterable<unknown> | undefined,
): Record<string, string> {
  if (typeof stdin === "string") return { stdin };
  if (stdin instanceof Uint8Array) return { stdin_b64: Buffer.from(stdin).toString("base64") };
  return {};
}

/** The NDJSON request of a streamed-stdin exec: the exec request, then one line per stdin chunk, then EOF. */
async function* stdinFrames(
  exec: Record<string, unknown>,
  stdin: AsyncIterable<string | Uint8Array>,
): AsyncGenerator<Buffer> {
  yield Buffer.from(`${JSON.stringify(exec)}\n`);
  for await (const chunk of stdin) {
    const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : Buffer.from(chunk);
    for (let offset = 0; offset < bytes.length; offset += STDIN_FRAME_BYTES) {
      const part = bytes.subarray(offset, offset + STDIN_FRAME_BYTES).toString("base64");
      yield Buffer.from(`${JSON.stringify({ stdin_b64: part })}\n`);
    }
  }
  yield Buffer.from(`${JSON.stringify({ eof: true })}\n`);
}

function required(value: string, name: string): string {
  if (typeof value !== "string" || value === "")
    throw new InvalidArgumentError(`${name} must be a non-empty string`);
  return value;
}
