/**
 * Controller: the daemon's REST API as methods, with forkd v0.5's method set and option names (camelCase in,
 * the wire's JSON documents out). The Sandbox class builds on it. Every method takes per-call options
 * (`requestTimeoutMs`, `signal`, `token`, `headers`) that override the client's.
 */
import type { IncomingMessage } from "node:http";
import {
  DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS,
  GUEST_WORK_GRACE_MS,
  NDJSON_CONTENT_TYPE,
  SPAWN_MS_PER_CHILD,
} from "../common/limits.js";
import { CallScope } from "./call-scope.js";
import { ForkdSdkError, InvalidArgumentError } from "./errors.js";
import { commandTimeoutMs, execBody, inlineStdin, stdinFrames, wireTimeoutMs } from "./exec-request.js";
import { type ExecEvent, execEvents } from "./exec-stream.js";
import {
  type BranchOptions,
  type CreateSnapshotOptions,
  type EvalCodeOptions,
  type ExecCommandOptions,
  type ExecStreamOptions,
  type NetworkPolicy,
  policyToWire,
  type ReadFileOptions,
  required,
  type SpawnOptions,
  type WriteFileOptions,
} from "./options.js";
import {
  downloadPack,
  type PackDownload,
  type PackOptions,
  packUploadRequest,
  type UnpackOptions,
} from "./pack-transfer.js";
import {
  type ConnectionOptions,
  checkDurationMs,
  type DaemonAddress,
  DEFAULT_COMMAND_TIMEOUT_MS,
  type RequestOptions,
  type ResolvedSettings,
  resolveSettings,
} from "./settings.js";
import { exchange, type HttpRequest, isDaemonReachable, openStream, pathOf } from "./transport.js";
import type {
  BranchResult,
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
  SnapshotDiffResult,
  SnapshotInfo,
  UnpackResult,
  VersionInfo,
  WorkspaceInfo,
} from "./wire.js";

/** How to reach a sandbox's port through the daemon's port proxy (Controller.portEndpoint). */
export interface PortEndpoint {
  /** The daemon: its Unix socket or its TCP address. */
  address: DaemonAddress;
  /** Put before each request's own path (it includes the address's base path). */
  pathPrefix: string;
  /** Headers every forwarded request needs: the bearer token when one is set, and the client's extra headers. */
  headers: Record<string, string>;
}

/** Building an image, booting and warming a parent takes minutes under TCG (the table's default). */
export { DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS };

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
    if (options.publicPorts !== undefined) body.public_ports = options.publicPorts;
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
          contentType: NDJSON_CONTENT_TYPE,
          accept: NDJSON_CONTENT_TYPE,
        }
      : { method: "POST", path, json: { ...exec, ...inlineStdin(stdin) }, accept: NDJSON_CONTENT_TYPE };
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
  async packSnapshot(tag: string, options: PackOptions): Promise<PackDownload> {
    return downloadPack(this.settings(options), tag, options);
  }

  /**
   * Sends the pack in `file` to the daemon, which verifies every entry and installs its snapshots, all or none
   * (`tag`: the head's new tag; `force`: replace same-tagged snapshots that differ).
   */
  async unpackSnapshot(file: string, options: UnpackOptions = {}): Promise<UnpackResult> {
    return this.json<UnpackResult>(await packUploadRequest(file, options), options);
  }

  /**
   * Layers a new snapshot `tag` on `from` by running `exec` in a fresh sandbox (a shell string runs under
   * `sh -c`; an array runs as argv); the daemon BRANCHes it in diff mode and kills the sandbox. A failing command
   * rejects with InvalidArgumentError (HTTP 422) carrying its output in the message.
   */
  async snapshotDiff(
    from: string,
    options: RequestOptions & { tag: string; exec: string | string[]; execTimeoutMs?: number },
  ): Promise<SnapshotDiffResult> {
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

  /**
   * The end of the sandbox's serial console as the daemon kept it (bounded per sandbox, kept across daemon
   * restarts): up to `bytes` bytes (default 64 KiB, at most 4 MiB).
   */
  async readConsole(id: string, options: RequestOptions & { bytes?: number } = {}): Promise<Buffer> {
    const response = await this.send(
      {
        method: "GET",
        path: pathOf`/v1/sandboxes/${required(id, "id")}/console`,
        query: { bytes: options.bytes },
        accept: "text/plain",
      },
      options,
    );
    return response.body;
  }

  /**
   * Where a TCP port of a sandbox is reached through the daemon's port proxy (HTTP and WebSocket): the daemon's
   * address, the path prefix to put before each request's own path, and the headers each request needs (the
   * bearer token). For a client that forwards connections itself, like `forkd port`.
   */
  portEndpoint(id: string, port: number, call: RequestOptions = {}): PortEndpoint {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new InvalidArgumentError(`port must be an integer in 1..65535, got ${port}`);
    }
    const settings = this.settings(call);
    const base = settings.address.kind === "tcp" ? settings.address.basePath : "";
    return {
      address: settings.address,
      pathPrefix: base + pathOf`/v1/sandboxes/${required(id, "id")}/ports/${String(port)}`,
      headers: {
        ...settings.headers,
        ...(settings.token === undefined ? {} : { authorization: `Bearer ${settings.token}` }),
      },
    };
  }

  // --- workspaces (forkd v0.5) ---------------------------------------------------------------------------

  async listWorkspaces(call: RequestOptions = {}): Promise<WorkspaceInfo[]> {
    return this.json<WorkspaceInfo[]>({ method: "GET", path: "/v1/workspaces" }, call);
  }

  async getWorkspace(name: string, call: RequestOptions = {}): Promise<WorkspaceInfo> {
    return this.json<WorkspaceInfo>(
      { method: "GET", path: pathOf`/v1/workspaces/${required(name, "name")}` },
      call,
    );
  }

  /** A running sandbox from `snapshotTag` under `name` (1-64 of letters, digits, '-', '_'). */
  async createWorkspace(
    options: RequestOptions & { name: string; snapshotTag: string; memoryLimitMib?: number },
  ): Promise<WorkspaceInfo> {
    const body: Record<string, unknown> = {
      name: required(options.name, "name"),
      snapshot_tag: required(options.snapshotTag, "snapshotTag"),
    };
    if (options.memoryLimitMib !== undefined) body.memory_limit_mib = options.memoryLimitMib;
    return this.json<WorkspaceInfo>({ method: "POST", path: "/v1/workspaces", json: body }, options);
  }

  /**
   * Suspends a running workspace: its sandbox paused to disk, its RAM given back. `diff`: a layer over the previous
   * suspend's instead of one holding everything since its snapshot.
   */
  async suspendWorkspace(
    name: string,
    options: RequestOptions & { diff?: boolean } = {},
  ): Promise<WorkspaceInfo> {
    return this.json<WorkspaceInfo>(
      {
        method: "POST",
        path: pathOf`/v1/workspaces/${required(name, "name")}/suspend`,
        json: options.diff === undefined ? {} : { diff: options.diff },
      },
      options,
    );
  }

  /** Resumes a suspended workspace where it was (the same sandbox id, network and policy). */
  async resumeWorkspace(name: string, call: RequestOptions = {}): Promise<WorkspaceInfo> {
    return this.json<WorkspaceInfo>(
      { method: "POST", path: pathOf`/v1/workspaces/${required(name, "name")}/resume`, json: {} },
      call,
    );
  }

  /** Deletes a workspace: its sandbox is killed, its layers removed unless a snapshot uses them. */
  async deleteWorkspace(name: string, call: RequestOptions = {}): Promise<void> {
    await this.send({ method: "DELETE", path: pathOf`/v1/workspaces/${required(name, "name")}` }, call);
  }

  // --- files -------------------------------------------------------------------------------------------

  /** Replaces (or creates) a file, creating parent directories. Binary-safe; at most ~16 MiB per call (413). */
  async writeFile(
    id: string,
    path: string,
    data: Uint8Array | string,
    options: WriteFileOptions = {},
  ): Promise<{ path: string; bytes: number }> {
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
