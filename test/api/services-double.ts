/**
 * TEST DOUBLE of the daemon's services (SandboxService/SnapshotService), for HTTP-level tests only: validation,
 * status codes, auth, error shapes and streaming framing. It runs no VM and proves nothing about sandboxes; the
 * end-to-end tests (test/api/e2e.test.ts) use the real manager with real QEMU guests.
 *
 * Its "commands" are scripted by argv[0]:
 *   echo ARGS...        stdout = ARGS joined by spaces + "\n"
 *   cat                 stdout = stdin (streamed chunk by chunk)
 *   exit N              exit code N, stderr "bye\n"
 *   split-utf8          writes "é" (2 bytes) split across two chunks, then a 0xff byte
 *   flood BYTES         writes BYTES of "x" in 64 KiB chunks, as fast as possible
 *   sleep MS            exits 0 after MS milliseconds (cancellable)
 *   hang                never exits until cancelled (records the cancellation in `cancelled`)
 *
 * Its chains (snapshot detail, delete with cascade/force, compact) are checked against the real controller's on
 * the same chain shape by test/api/chains.test.ts.
 *
 * Owners (tenancy) are recorded as the real services record them: a spawn's `owner`, a branch's from its sandbox,
 * a created or compacted snapshot's and an alias's from the request; its not-found messages are the real ones.
 *
 * Its sandboxes' ports (proxyHttp, proxyUpgrade) answer 200 with a JSON echo of what reached them: {sandbox,
 * port, method, url, headers}. Policies, inbound settings and per_child_netns are checked by the manager's own
 * validators. The
 * real port proxy, to servers in real guests, is tested on VMs (test/net, test/e2b/sdk-e2e).
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type {
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  FileContent,
  FileInfo,
  FileListing,
  PingInfo,
} from "../../src/agent/host/types.js";
import { abortError } from "../../src/common/deadline.js";
import { ForkdError } from "../../src/common/errors.js";
import type {
  EgressPolicyInput,
  SandboxInfo,
  SandboxService,
  SnapshotInfo,
  SnapshotService,
  SpawnRequest,
} from "../../src/controller/sandbox-service.js";
import { validateInbound, validateOwnNamespace } from "../../src/controller/sandboxes/settings.js";
import type { TemplateAlias } from "../../src/controller/snapshots/template-aliases.js";
import { parseEgressPolicy } from "../../src/net/policy.js";

export class ServicesDouble {
  readonly snapshotsByTag = new Map<string, SnapshotInfo>();
  readonly sandboxesById = new Map<string, SandboxInfo>();
  readonly filesByPath = new Map<string, Buffer>();
  /** Ids of sandboxes whose exec was cancelled (client went away). */
  readonly cancelled: string[] = [];
  /** Set by close(). */
  closed = false;
  /** Last spawn request the double received. */
  lastSpawn: SpawnRequest | undefined;
  lastNetworkPolicy: EgressPolicyInput | undefined;
  lastBranch: Parameters<SandboxService["branch"]>[1] | undefined;
  lastPause: Parameters<SandboxService["pause"]>[1] | undefined;
  lastResume: Parameters<SandboxService["resume"]>[1] | undefined;
  lastSnapshotDiff: Parameters<SandboxService["snapshotDiff"]>[0] | undefined;
  lastCreate: Parameters<SnapshotService["create"]>[0] | undefined;
  /** The bytes of the last pack the double received, and the directories of packs it made. */
  lastUnpacked: Buffer | undefined;
  readonly packDirs: string[] = [];
  readonly aliasesByName = new Map<string, TemplateAlias>();
  private counter = 0;

  constructor() {
    this.addSnapshot("py");
  }

  addSnapshot(tag: string, overrides: Partial<SnapshotInfo> = {}): SnapshotInfo {
    const info: SnapshotInfo = {
      tag,
      created_at_unix: 1_700_000_000,
      status: "ready",
      bootable: true,
      template: "python",
      accelerator: "tcg",
      memory_mib: 512,
      parent_tag: null,
      bytes: 1234,
      error: null,
      vcpus: 1,
      source_sandbox: null,
      aliases: [],
      ephemeral: false,
      owner: null,
      origin: "template",
      branch_mode: null,
      disk_bytes: 1024,
      egress_default: null,
      ...overrides,
    };
    this.snapshotsByTag.set(tag, info);
    return info;
  }

  readonly snapshots: SnapshotService = {
    list: async () => [...this.snapshotsByTag.values()],
    get: async (tag) => this.snapshot(tag),
    create: async (request) => {
      this.lastCreate = request;
      const { tag, template } = request;
      if (this.snapshotsByTag.has(tag)) throw new ForkdError("conflict", `snapshot ${tag} already exists`);
      return this.addSnapshot(tag, { template: template ?? "from-image", owner: request.owner ?? null });
    },
    detail: async (tag) => {
      const info = this.snapshot(tag);
      // The ancestors that exist, and the first one that does not (a forced delete orphaned this chain).
      const ancestors: string[] = [];
      let missing: string | null = null;
      for (let p = info.parent_tag; p !== null && !ancestors.includes(p); ) {
        const parent = this.snapshotsByTag.get(p);
        if (!parent) {
          missing = p;
          break;
        }
        ancestors.unshift(p);
        p = parent.parent_tag;
      }
      const dependents = this.dependentsOf(tag);
      return {
        ...info,
        chain_depth: ancestors.length + (missing === null ? 0 : 1),
        parent_content_hash: info.parent_tag === null ? null : "0".repeat(64),
        ancestors,
        dependents,
        all_dependents: this.subtreeOf(tag),
        layers: [],
        chain_bytes: { memory_physical: 0, disk_physical: 0, vmstate: 0 },
        memory_logical_bytes: 0,
        memory_physical_bytes: 0,
        vmstate_bytes: 0,
        chain_error:
          missing === null ? null : `the chain of ${tag} needs ${missing}, which is missing (the double)`,
      };
    },
    delete: async (tag, options = {}) => {
      if (options.cascade && options.force) {
        throw new ForkdError("invalid_argument", "--cascade and --force exclude each other");
      }
      this.snapshot(tag);
      const subtree = this.subtreeOf(tag);
      if (subtree.length > 0 && !options.cascade && !options.force) {
        throw new ForkdError("conflict", `snapshot ${tag} has dependents: ${subtree.join(", ")}`);
      }
      const doomed = options.cascade ? [...subtree.reverse(), tag] : [tag];
      for (const t of doomed) this.snapshotsByTag.delete(t);
      return doomed;
    },
    compact: async ({ from, to, owner }) => {
      const source = this.snapshot(from);
      if (this.snapshotsByTag.has(to)) throw new ForkdError("conflict", `snapshot ${to} already exists`);
      return this.addSnapshot(to, { template: source.template, parent_tag: null, owner: owner ?? null });
    },
    // A "pack" here is the tag's name repeated: the route's streaming is what these tests look at.
    pack: async ({ tag }) => {
      this.snapshot(tag);
      const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-double-pack-"));
      const file = path.join(dir, "pack");
      const bytes = Buffer.from(`pack of ${tag}\n`.repeat(1000));
      await writeFile(file, bytes);
      this.packDirs.push(dir);
      return {
        file,
        result: {
          out: file,
          chain: [tag],
          files: 1,
          content_bytes: bytes.length,
          pack_bytes: bytes.length,
          image_included: false,
          ms: 1,
        },
        dispose: async () => {
          await rm(dir, { recursive: true, force: true });
        },
      };
    },
    pull: async () => {
      throw new ForkdError("not_implemented", "the services double has no registry");
    },
    push: async () => {
      throw new ForkdError("not_implemented", "the services double has no registry");
    },
    unpack: async ({ body, maxBytes, tag }) => {
      const parts: Buffer[] = [];
      let size = 0;
      for await (const chunk of body) {
        size += chunk.length;
        if (size > maxBytes) throw new ForkdError("payload_too_large", "too large");
        parts.push(chunk);
      }
      this.lastUnpacked = Buffer.concat(parts);
      const head = tag ?? "unpacked";
      this.addSnapshot(head);
      return {
        head,
        chain: [head],
        installed: [head],
        reused: [],
        replaced: [],
        orphaned: [],
        image: "present",
        content_bytes: size,
        ms: 1,
      };
    },
    aliases: {
      list: async () => [...this.aliasesByName.values()],
      get: async (alias) => {
        const row = this.aliasesByName.get(alias);
        if (!row) throw new ForkdError("not_found", `template alias ${JSON.stringify(alias)} not found`);
        return row;
      },
      set: async (alias, tag, owner) => {
        this.snapshot(tag);
        const row = {
          alias,
          tag,
          created_at_unix: 1_700_000_000,
          owner: owner === undefined ? (this.aliasesByName.get(alias)?.owner ?? null) : owner,
        };
        this.aliasesByName.set(alias, row);
        return row;
      },
      delete: (alias) => {
        if (!this.aliasesByName.delete(alias)) {
          throw new ForkdError("not_found", `template alias ${JSON.stringify(alias)} not found`);
        }
      },
    },
    retire: async (tag) => {
      this.snapshot(tag);
      this.snapshotsByTag.delete(tag);
      return "deleted";
    },
    resolveTemplate: async (name) => {
      const row = this.aliasesByName.get(name);
      if (row) return { tag: row.tag, alias: name };
      return { tag: this.snapshot(name).tag, alias: null };
    },
    defaultTemplate: async () => (this.snapshotsByTag.has("py") ? "py" : null),
  };

  private dependentsOf(tag: string): string[] {
    return [...this.snapshotsByTag.values()].filter((s) => s.parent_tag === tag).map((s) => s.tag);
  }

  /** Every snapshot depending on `tag`, parents before children. */
  private subtreeOf(tag: string): string[] {
    const out: string[] = [];
    const queue = [tag];
    while (queue.length > 0) {
      for (const child of this.dependentsOf(queue.shift() as string)) {
        if (out.includes(child)) continue;
        out.push(child);
        queue.push(child);
      }
    }
    return out;
  }

  /** What branchLoad() reports (metrics tests set it). */
  branchLoadNow = { inFlight: 0, cap: 2 };

  readonly sandboxes: SandboxService = {
    branchLoad: () => this.branchLoadNow,
    spawn: async (request) => {
      this.lastSpawn = request;
      validateOwnNamespace(request, this.sandboxes.networkStatus());
      const snap = this.snapshot(request.snapshotTag);
      const policy =
        typeof request.network === "object"
          ? parseEgressPolicy({ default: "allow", ...request.network })
          : { default: "allow" as const, allowOut: [], denyOut: [] };
      const inbound = validateInbound(request.inbound);
      if (!snap.bootable) throw new ForkdError("conflict", `snapshot ${snap.tag} is not bootable`);
      const out: SandboxInfo[] = [];
      for (let i = 0; i < request.n; i++) {
        const id = `sb-${(++this.counter).toString(16).padStart(12, "0")}`;
        // Asserted rather than annotated: the double stays valid while SandboxInfo grows fields (live_fork).
        const info = {
          id,
          snapshot_tag: snap.tag,
          created_at_unix: 1_700_000_100,
          pid: 4242,
          memory_limit_mib: request.memoryLimitMiB ?? null,
          status: "running",
          expires_at_unix_ms: request.timeoutMs === 0 ? null : 1_700_000_400_000,
          ready_ms: 12.5,
          accelerator: "tcg",
          live_fork: false,
          branch_count: 0,
          last_branch_tag: null,
          last_branch_memory_path: null,
          metadata: request.metadata ?? {},
          template_alias: request.templateAlias ?? null,
          timeout_ms: request.timeoutMs ?? null,
          on_timeout: request.onTimeout ?? "kill",
          auto_resume: request.autoResume === true,
          pause_tag: null,
          paused_at_unix_ms: null,
          inbound,
          owner: request.owner ?? null,
          limits: {
            memory_mib: request.memoryLimitMiB ?? 768,
            cpu_millicores: 1000,
            pids: 128,
            disk_mib: 2048,
          },
          network: {
            kind: "netns",
            netns: `forkd-${id}`,
            address: "10.43.0.2",
            guestAddress: "10.42.0.2",
            policy,
          },
        } as SandboxInfo;
        this.sandboxesById.set(id, info);
        out.push(info);
      }
      return out;
    },
    list: (filter) =>
      [...this.sandboxesById.values()].filter(
        (s) =>
          (!filter?.snapshotTag || s.snapshot_tag === filter.snapshotTag) &&
          (!filter?.status || s.status === filter.status),
      ),
    get: (id) => this.sandbox(id),
    pause: async (id, request) => {
      const sb = this.sandbox(id);
      if (sb.status !== "running") throw new ForkdError("conflict", `sandbox ${id} is ${sb.status}`);
      this.lastPause = request;
      sb.status = "paused";
      sb.pause_tag = `pause-${id}-1`;
      sb.pid = null;
      return {
        sandbox: sb,
        tag: sb.pause_tag,
        pause_ms: 3.5,
        write_ms: 40,
        bytes_captured: 8192,
        bytes_stored: 4096,
        merged: request?.merge === "always",
        freed_bytes: 1 << 20,
      };
    },
    resume: async (id, request) => {
      const sb = this.sandbox(id);
      if (sb.status !== "paused")
        throw new ForkdError("conflict", `sandbox ${id} is ${sb.status}, not paused`);
      this.lastResume = request;
      sb.status = "running";
      sb.pid = 4243;
      return sb;
    },
    workspaces: {
      list: () => [],
      get: (name) => {
        throw new ForkdError("not_found", `workspace ${name} not found`);
      },
      create: async () => {
        throw new ForkdError("not_implemented", "the test double has no workspaces");
      },
      suspend: async (name) => {
        throw new ForkdError("not_found", `workspace ${name} not found`);
      },
      resume: async (name) => {
        throw new ForkdError("not_found", `workspace ${name} not found`);
      },
      delete: async (name) => {
        throw new ForkdError("not_found", `workspace ${name} not found`);
      },
    },
    kill: async (id) => {
      this.sandbox(id);
      this.sandboxesById.delete(id);
    },
    killAll: async (filter) => {
      const ids = this.sandboxes.list(filter).map((s) => s.id);
      for (const id of ids) this.sandboxesById.delete(id);
      return ids;
    },
    setTimeout: (id, timeoutMs) => {
      const sb = this.sandbox(id);
      sb.expires_at_unix_ms = timeoutMs === 0 ? null : 1_700_000_000_000 + timeoutMs;
      return sb;
    },
    console: async (id) => {
      this.sandbox(id);
      return "console of the double\n";
    },
    confinementStatus: () => ({
      mode: "on",
      summary: "on (the double)",
      uid_base: 2_000_000_000,
      seccomp: true,
      cgroups: { memory: "v1", cpu: "v1", pids: "v1" },
      default_disk_limit_mib: 2048,
      console_log_bytes: 4 * 2 ** 20,
    }),
    networkStatus: () => ({
      mode: "netns",
      reason: null,
      bridge: "forkd0",
      subnet: "10.43.0.0/16",
      dns: "10.43.0.1:53",
      dns_upstreams: ["192.0.2.53:53"],
      default_egress: "allow",
    }),
    setNetworkPolicy: async (id, policy) => {
      const sb = this.sandbox(id);
      this.lastNetworkPolicy = policy;
      sb.network = { ...sb.network, policy: parseEgressPolicy({ default: "allow", ...policy }) };
      return sb;
    },
    proxyHttp: async (id, port, req, res) => {
      if (this.sandbox(id).network.kind !== "netns") {
        throw new ForkdError("conflict", `sandbox ${id} has no network the daemon can reach`);
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(echo(id, port, req));
      return null;
    },
    proxyUpgrade: (id, port, req, socket) => {
      if (this.sandbox(id).network.kind !== "netns") {
        throw new ForkdError("conflict", `sandbox ${id} has no network the daemon can reach`);
      }
      const body = echo(id, port, req);
      socket.end(
        `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n` +
          `connection: close\r\n\r\n${body}`,
      );
    },
    snapshotDiff: async (request) => {
      this.lastSnapshotDiff = request;
      const [sandbox] = await this.sandboxes.spawn({
        snapshotTag: request.from,
        n: 1,
        owner: request.owner,
      });
      const outcome = await this.sandboxes.branch((sandbox as SandboxInfo).id, {
        tag: request.tag,
        mode: "diff",
      });
      return { ...outcome, exit_code: 0, stdout: "ok\n", stderr: "" };
    },
    branch: async (id, request) => {
      const sb = this.sandbox(id);
      this.lastBranch = request;
      const mode = request.mode ?? "full";
      const tag = request.tag ?? `branch-${id}`;
      const parentTag = mode === "full" ? null : sb.snapshot_tag;
      return {
        tag,
        mode,
        parent_tag: parentTag,
        status: mode === "live" && request.wait === false ? "writing" : "ready",
        pause_ms: 4.2,
        capture_ms: 1.6,
        ram_bytes: 512 * 1024 * 1024,
        bytes_captured: 8192,
        bytes_written: 16384,
        snapshot: {
          tag,
          created_at_unix: 1_700_000_000,
          status: "ready",
          bootable: true,
          template: "pyagent",
          accelerator: "tcg",
          memory_mib: 512,
          parent_tag: parentTag,
          bytes: 16384,
          error: null,
          vcpus: 1,
          source_sandbox: id,
          aliases: request.alias === undefined ? [] : [request.alias],
          ephemeral: false,
          owner: sb.owner,
          origin: "branch",
          branch_mode: mode,
          disk_bytes: 12288,
          egress_default: null,
        },
      };
    },
    ping: async (id): Promise<PingInfo> => {
      this.sandbox(id);
      return {
        protocol: 1,
        agentVersion: "double",
        template: "python",
        interpreter: "python",
        warm: "warm",
        sandboxId: id,
        hostname: id,
        uptimeMs: 5,
      };
    },
    exec: (id, argv, options) => this.exec(id, argv, options ?? {}),
    eval: async (id, code): Promise<EvalOutcome> => {
      this.sandbox(id);
      const failing = code.includes("1/0");
      return {
        result: failing ? null : `'${code}'`,
        resultTruncated: false,
        stdout: "",
        stderr: "",
        stdoutTruncated: false,
        stderrTruncated: false,
        error: failing
          ? { type: "ZeroDivisionError", message: "division by zero", traceback: "Traceback ...\n" }
          : null,
        timedOut: false,
        durationMs: 1,
      };
    },
    files: {
      write: async (id, path, data) => {
        this.sandbox(id);
        this.filesByPath.set(`${id}:${path}`, Buffer.from(data));
        return { bytes: data.length };
      },
      read: async (id, path, options): Promise<FileContent> => {
        const data = this.file(id, path);
        const max = options?.maxBytes ?? data.length;
        return { data: data.subarray(0, max), size: data.length, truncated: data.length > max };
      },
      list: async (id, path): Promise<FileListing> => {
        this.sandbox(id);
        const prefix = `${id}:${path.replace(/\/$/, "")}/`;
        const entries: FileInfo[] = [...this.filesByPath.entries()]
          .filter(([key]) => key.startsWith(prefix))
          .map(([key, data]) => ({
            name: key.slice(prefix.length),
            type: "file",
            size: data.length,
            mode: 0o644,
            mtimeMs: 1,
          }));
        return { entries, truncated: false };
      },
      stat: async (id, path): Promise<FileInfo> => {
        const data = this.file(id, path);
        return {
          name: path.split("/").pop() ?? "",
          type: "file",
          size: data.length,
          mode: 0o644,
          mtimeMs: 1,
        };
      },
      remove: async (id, path) => {
        this.file(id, path);
        this.filesByPath.delete(`${id}:${path}`);
      },
      mkdir: async () => notInDouble("files.mkdir"),
      move: async () => notInDouble("files.move"),
      watch: () => notInDouble("files.watch"),
    },
    extendTimeout: (id, timeoutMs) => {
      const sb = this.sandbox(id);
      sb.expires_at_unix_ms = Math.max(sb.expires_at_unix_ms ?? 0, 1_700_000_000_000 + timeoutMs);
      return sb;
    },
    accessTokens: (id) => {
      this.sandbox(id);
      return { envd: `envd-${id}`, traffic: `traffic-${id}` };
    },
    verifyAccessToken: (id, kind, token) => this.sandboxesById.has(id) && token === `${kind}-${id}`,
    envVars: (id) => {
      this.sandbox(id);
      return {};
    },
    metrics: async () => notInDouble("metrics"),
    metricsHistory: async () => notInDouble("metricsHistory"),
    // Made-up numbers (the double has no processes): the shape is what HTTP tests check.
    usage: async (filter = {}) =>
      [...this.sandboxesById.values()]
        .filter((sb) => sb.status === "running" && (filter.ids === undefined || filter.ids.includes(sb.id)))
        .map((sb) => ({
          id: sb.id,
          timestamp_unix_ms: 1_700_000_500_000,
          rss_bytes: 48 * 2 ** 20,
          pss_bytes: 30 * 2 ** 20,
          private_bytes: 20 * 2 ** 20,
          cpu_seconds: 1.5,
          cpu_used_pct: 2.5,
          cpu_window_ms: 2000,
        })),
    host: async () => {
      const sandboxes = { starting: 0, running: 0, pausing: 0, paused: 0, resuming: 0, stopping: 0, dead: 0 };
      for (const sb of this.sandboxesById.values()) sandboxes[sb.status]++;
      return {
        timestamp_unix_ms: 1_700_000_500_000,
        cpu_count: 2,
        cpu_used_pct: 12.5,
        cpu_window_ms: 2000,
        load_avg: [0.5, 0.25, 0.125] as [number, number, number],
        mem_total_bytes: 24 * 2 ** 30,
        mem_available_bytes: 20 * 2 ** 30,
        daemon_rss_bytes: 80 * 2 ** 20,
        sandboxes,
      };
    },
    fork: async () => notInDouble("fork"),
    procs: {
      start: () => notInDouble("procs.start"),
      connect: () => notInDouble("procs.connect"),
      list: async () => notInDouble("procs.list"),
      input: async () => notInDouble("procs.input"),
      closeStdin: async () => notInDouble("procs.closeStdin"),
      signal: async () => notInDouble("procs.signal"),
      resize: async () => notInDouble("procs.resize"),
    },
    contexts: {
      create: async () => notInDouble("contexts.create"),
      list: async () => notInDouble("contexts.list"),
      restart: async () => notInDouble("contexts.restart"),
      remove: async () => notInDouble("contexts.remove"),
    },
  };

  async close(): Promise<void> {
    this.closed = true;
  }

  private snapshot(tag: string): SnapshotInfo {
    const snap = this.snapshotsByTag.get(tag);
    if (!snap) throw new ForkdError("not_found", `snapshot ${JSON.stringify(tag)} not found`);
    return snap;
  }

  private sandbox(id: string): SandboxInfo {
    const sb = this.sandboxesById.get(id);
    if (!sb) throw new ForkdError("not_found", `sandbox ${id} not found`);
    return sb;
  }

  private file(id: string, path: string): Buffer {
    this.sandbox(id);
    const data = this.filesByPath.get(`${id}:${path}`);
    if (!data) throw new ForkdError("not_found", `${path}: no such file`);
    return data;
  }

  private async exec(id: string, argv: string[], options: ExecOptions): Promise<ExecOutcome> {
    this.sandbox(id);
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    const out = (b: Buffer) => {
      stdout.push(b);
      options.onStdout?.(b);
    };
    const err = (b: Buffer) => {
      stderr.push(b);
      options.onStderr?.(b);
    };
    let exitCode = 0;
    const started = performance.now();
    switch (argv[0]) {
      case "echo":
        out(Buffer.from(`${argv.slice(1).join(" ")}\n`));
        break;
      case "cat": {
        const input = options.stdin;
        if (typeof input === "string" || Buffer.isBuffer(input)) out(Buffer.from(input));
        else if (input) for await (const chunk of input) out(Buffer.from(chunk));
        break;
      }
      case "exit":
        err(Buffer.from("bye\n"));
        exitCode = Number(argv[1] ?? 1);
        break;
      case "split-utf8":
        out(Buffer.from([0xc3]));
        await new Promise((r) => setTimeout(r, 5));
        out(Buffer.from([0xa9, 0x0a, 0xff]));
        break;
      case "flood": {
        const total = Number(argv[1]);
        for (let sent = 0; sent < total; sent += 65536) {
          if (options.signal?.aborted) throw abortError(options.signal, "exec");
          out(Buffer.alloc(Math.min(65536, total - sent), "x"));
          await new Promise((r) => setImmediate(r));
        }
        break;
      }
      case "sleep":
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(resolve, Number(argv[1]));
          options.signal?.addEventListener("abort", () => {
            clearTimeout(timer);
            this.cancelled.push(id);
            reject(abortError(options.signal as AbortSignal, "exec"));
          });
        });
        out(Buffer.from("slept\n"));
        break;
      case "hang":
        await new Promise<void>((_resolve, reject) => {
          const signal = options.signal;
          if (!signal) return;
          signal.addEventListener("abort", () => {
            this.cancelled.push(id);
            reject(abortError(signal, "exec"));
          });
        });
        break;
      default:
        throw new ForkdError("not_found", `exec: ${argv[0]}: command not found (test double)`);
    }
    const all = (parts: Buffer[]) => Buffer.concat(parts);
    return {
      exitCode,
      signal: null,
      timedOut: false,
      stdout: all(stdout),
      stderr: all(stderr),
      stdoutTruncated: false,
      stderrTruncated: false,
      stdoutBytes: all(stdout).length,
      stderrBytes: all(stderr).length,
      durationMs: performance.now() - started,
    };
  }
}

/** What the HTTP tests never reach: the real manager serves it (test/e2b, test/api/e2e.test.ts). */
function notInDouble(what: string): never {
  throw new ForkdError("not_implemented", `${what} is not part of the HTTP test double`);
}

/** What a double's sandbox port answers: the request as it reached the guest. */
function echo(id: string, port: number, req: { method?: string; url?: string; headers: object }): string {
  return JSON.stringify({ sandbox: id, port, method: req.method, url: req.url, headers: req.headers });
}
