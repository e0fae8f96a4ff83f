/** /v1/sandboxes: spawn, list, inspect, kill, lifetime, and the buffered ping/exec/eval calls. */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { DEFAULT_EXEC_TIMEOUT_SECS } from "../../common/limits.js";
import { DEFAULT_BRANCH_MODE } from "../../controller/snapshots/branch.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import { notImplemented } from "../errors.js";
import {
  BranchBody,
  BranchResultWire,
  ConfinementStatusWire,
  ConsoleQuery,
  EvalBody,
  EvalResponse,
  ExecBody,
  ExecResponse,
  errorResponses,
  ForkBody,
  ForkResponse,
  KillManyQuery,
  KillManyResponse,
  ListSandboxesQuery,
  MAX_EXEC_REQUEST_BYTES,
  OptionalBody,
  PauseBody,
  PauseResponse,
  PingResponse,
  ResumeBody,
  SandboxInfoWire,
  SandboxMetricsWire,
  SandboxParams,
  SetTimeoutBody,
  SpawnBody,
} from "../schemas.js";
import {
  branchToWire,
  evalToWire,
  execToWire,
  networkRequestFromWire,
  pingToWire,
  sandboxToWire,
} from "../wire.js";

type IdRequest = { Params: Static<typeof SandboxParams> };

const NOT_BUILT_SPAWN_FLAGS = {
  prewarm: "prewarm (faulting in guest pages after restore)",
  hugepages: "hugepages-backed guest RAM",
} as const;

export function registerSandboxRoutes(app: FastifyInstance, context: ApiContext): void {
  const { metrics } = context;

  app.post<{ Body: Static<typeof SpawnBody> }>(
    "/v1/sandboxes",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Fork n sandboxes from a snapshot",
        description:
          "All or nothing: 201 with n SandboxInfo once every child is ready. 404 unknown tag, 409 snapshot not " +
          "bootable, 429/503 when admission limits or host memory would be exceeded.",
        body: SpawnBody,
        response: { 201: Type.Array(SandboxInfoWire), ...errorResponses },
      },
    },
    async (request, reply) => {
      const body = request.body;
      for (const [field, feature] of Object.entries(NOT_BUILT_SPAWN_FLAGS)) {
        if (body[field as keyof typeof NOT_BUILT_SPAWN_FLAGS] === true) {
          throw notImplemented(`${field}=true: ${feature} is not implemented in this forkd yet; send false`);
        }
      }
      if (body.per_child_netns === true) {
        if (body.network === "none") {
          throw invalidArgument(
            'per_child_netns=true contradicts network "none" (a NIC with no namespace of its own)',
          );
        }
        const status = servicesOf(request).sandboxes.networkStatus();
        if (status.mode !== "netns") {
          throw notImplemented(
            `per_child_netns=true: this daemon runs isolated sandboxes (${status.reason})`,
          );
        }
      }
      const stop = metrics.spawnDuration.startTimer();
      try {
        const spawned = await servicesOf(request).sandboxes.spawn({
          snapshotTag: body.snapshot_tag,
          n: body.n ?? 1,
          memoryLimitMiB: body.memory_limit_mib ?? undefined,
          cpuLimitMillicores: body.cpu_limit_millicores,
          pidsLimit: body.pids_limit,
          diskLimitMiB: body.disk_limit_mib,
          timeoutMs: body.timeout_ms,
          liveFork: body.live_fork === true,
          metadata: body.metadata,
          env: body.env,
          network: networkRequestFromWire(body.network),
          onTimeout: body.on_timeout,
          signal: clientSignal(request, reply),
        });
        stop({ outcome: "ok" });
        for (const sb of spawned) {
          request.auditIds.push(sb.id);
          if (sb.ready_ms !== null) metrics.sandboxReady.observe(sb.ready_ms / 1000);
        }
        return reply.status(201).send(spawned.map(sandboxToWire));
      } catch (err) {
        stop({ outcome: "error" });
        throw err;
      }
    },
  );

  app.get<{ Querystring: Static<typeof ListSandboxesQuery> }>(
    "/v1/sandboxes",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "List sandboxes",
        querystring: ListSandboxesQuery,
        response: { 200: Type.Array(SandboxInfoWire), ...errorResponses },
      },
    },
    async (request) => {
      const { snapshot_tag: snapshotTag, status } = request.query;
      return servicesOf(request).sandboxes.list({ snapshotTag, status }).map(sandboxToWire);
    },
  );

  app.delete<{ Querystring: Static<typeof KillManyQuery> }>(
    "/v1/sandboxes",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Kill every sandbox (all=true) or every sandbox of one snapshot (snapshot_tag=T)",
        querystring: KillManyQuery,
        response: { 200: KillManyResponse, ...errorResponses },
      },
    },
    async (request) => {
      const { all, snapshot_tag: tag } = request.query;
      if (all === true && tag !== undefined) throw invalidArgument("give all=true or snapshot_tag, not both");
      if (all !== true && tag === undefined) {
        throw invalidArgument("refusing to kill without a filter: give all=true or snapshot_tag=<tag>");
      }
      const killed = await servicesOf(request).sandboxes.killAll(
        tag === undefined ? undefined : { snapshotTag: tag },
      );
      request.auditIds.push(...killed);
      return { killed };
    },
  );

  app.get<IdRequest>(
    "/v1/sandboxes/:id",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "One sandbox",
        params: SandboxParams,
        response: { 200: SandboxInfoWire, ...errorResponses },
      },
    },
    async (request) => sandboxToWire(servicesOf(request).sandboxes.get(request.params.id)),
  );

  app.delete<IdRequest>(
    "/v1/sandboxes/:id",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Kill a sandbox",
        params: SandboxParams,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      await servicesOf(request).sandboxes.kill(request.params.id);
      return reply.status(204).send();
    },
  );

  app.post<IdRequest & { Body: Static<typeof SetTimeoutBody> }>(
    "/v1/sandboxes/:id/timeout",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Set the remaining lifetime (0 = no limit)",
        params: SandboxParams,
        body: SetTimeoutBody,
        response: { 200: SandboxInfoWire, ...errorResponses },
      },
    },
    async (request) =>
      sandboxToWire(servicesOf(request).sandboxes.setTimeout(request.params.id, request.body.timeout_ms)),
  );

  app.post<IdRequest & { Body: Static<typeof PauseBody> | undefined }>(
    "/v1/sandboxes/:id/pause",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Pause: the sandbox's state into a snapshot layer, its VM stopped, its RAM given back",
        description:
          "Its id, metadata, env, tokens, network and policy stay; it is listed with status paused and survives " +
          "daemon restarts and host reboots. Calls into it answer 409 until it is resumed. 409 if it is not " +
          "running (already paused included); 503 when the disk or host memory cannot take the capture.",
        params: SandboxParams,
        body: OptionalBody(PauseBody),
        response: { 200: PauseResponse, ...errorResponses },
      },
    },
    async (request, reply) => {
      const outcome = await servicesOf(request).sandboxes.pause(request.params.id, {
        merge: request.body?.merge === true ? "always" : "auto",
        signal: clientSignal(request, reply),
      });
      request.auditIds.push(outcome.tag);
      return { ...outcome, sandbox: sandboxToWire(outcome.sandbox) };
    },
  );

  app.post<IdRequest & { Body: Static<typeof ResumeBody> | undefined }>(
    "/v1/sandboxes/:id/resume",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Resume a paused sandbox under the same id, where it was",
        description:
          "Processes, files and the interpreter continue; the guest gets the host's clock and fresh entropy; its " +
          "lifetime starts again (timeout_ms, else the one it had). 409 if it is not paused.",
        params: SandboxParams,
        body: OptionalBody(ResumeBody),
        response: { 200: SandboxInfoWire, ...errorResponses },
      },
    },
    async (request, reply) =>
      sandboxToWire(
        await servicesOf(request).sandboxes.resume(request.params.id, {
          timeoutMs: request.body?.timeout_ms,
          signal: clientSignal(request, reply),
        }),
      ),
  );

  app.post<IdRequest>(
    "/v1/sandboxes/:id/ping",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Round trip to the guest agent",
        params: SandboxParams,
        response: { 200: PingResponse, ...errorResponses },
      },
    },
    async (request, reply) =>
      pingToWire(
        await servicesOf(request).sandboxes.ping(request.params.id, {
          signal: clientSignal(request, reply),
        }),
      ),
  );

  app.post<IdRequest & { Body: Static<typeof ExecBody> }>(
    "/v1/sandboxes/:id/exec",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Run a command (argv, no shell) and return its output when it exits",
        description:
          "Output is captured up to 1 MiB per stream (see *_truncated); use /exec/stream for more or for live " +
          "output. A timeout kills the process group: timed_out=true, exit_code 128+9.",
        params: SandboxParams,
        body: ExecBody,
        response: { 200: ExecResponse, ...errorResponses },
      },
    },
    async (request, reply) => {
      const body = request.body;
      const options = execOptions(body);
      const stop = metrics.execDuration.startTimer({ op: "exec" });
      try {
        const outcome = await servicesOf(request).sandboxes.exec(request.params.id, body.args, {
          ...options,
          stdin: stdinOf(body),
          signal: clientSignal(request, reply),
        });
        stop({ outcome: "ok" });
        return execToWire(outcome, body.encoding ?? "utf8");
      } catch (err) {
        stop({ outcome: "error" });
        throw err;
      }
    },
  );

  app.post<IdRequest & { Body: Static<typeof EvalBody> }>(
    "/v1/sandboxes/:id/eval",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Evaluate Python in the sandbox's warm interpreter",
        description:
          "The result is repr() of the cell's trailing expression. A Python exception is not an HTTP error.",
        params: SandboxParams,
        body: EvalBody,
        response: { 200: EvalResponse, ...errorResponses },
      },
    },
    async (request, reply) => {
      const body = request.body;
      const stop = metrics.execDuration.startTimer({ op: "eval" });
      try {
        const outcome = await servicesOf(request).sandboxes.eval(request.params.id, body.code, {
          timeoutMs: timeoutMsOf(body, undefined),
          signal: clientSignal(request, reply),
        });
        stop({ outcome: "ok" });
        return evalToWire(outcome);
      } catch (err) {
        stop({ outcome: "error" });
        throw err;
      }
    },
  );

  app.post<IdRequest & { Body: Static<typeof BranchBody> }>(
    "/v1/sandboxes/:id/branch",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "BRANCH: snapshot a running sandbox mid-work; it keeps running",
        description:
          "mode full (the default, as in forkd v0.5: a snapshot that stands alone, flat memory and one disk layer, " +
          "no parent), diff (only the pages and blocks the sandbox changed, on top of its base: a chain) or live " +
          "(like diff, memory captured while the guest runs; needs a sandbox spawned with live_fork). 201 with the " +
          "new snapshot and the pause it cost; 202 with status writing for live + wait:false. 409 if the tag exists " +
          "or is being written; 503 when the host-wide BRANCH limit (--branch-concurrency) is reached. Legacy v0.5 " +
          "forms: diff/live booleans, parent_tag (must name the source's base), measure_diff (adds diff_ms and " +
          "diff_*_bytes, which diff mode always reports).",
        params: SandboxParams,
        body: BranchBody,
        response: { 201: BranchResultWire, 202: BranchResultWire, ...errorResponses },
      },
    },
    async (request, reply) => {
      const body = request.body;
      // forkd v0.5: `mode` wins; without it the legacy booleans; without those a full branch.
      const mode = body.mode ?? (body.live ? "live" : body.diff ? "diff" : DEFAULT_BRANCH_MODE);
      if ((body.live && mode !== "live") || (body.diff && mode !== "diff")) {
        throw invalidArgument(`mode ${mode} contradicts the legacy ${body.live ? "live" : "diff"} flag`);
      }
      const outcome = await servicesOf(request).sandboxes.branch(request.params.id, {
        tag: body.tag,
        mode,
        wait: body.wait,
        parentTag: body.parent_tag,
        alias: body.alias,
        signal: clientSignal(request, reply),
      });
      request.auditIds.push(outcome.tag);
      return reply.status(outcome.status === "writing" ? 202 : 201).send(
        branchToWire(outcome, request.params.id, context.snapshotsDir, {
          measure: body.measure_diff === true || mode === "diff",
        }),
      );
    },
  );
}

/** Fork, metrics: the lifecycle routes the E2B API also uses. */
export function registerForkRoutes(app: FastifyInstance): void {
  app.post<IdRequest & { Body: Static<typeof ForkBody> }>(
    "/v1/sandboxes/:id/fork",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Fork a sandbox: BRANCH it once, restore count children from the snapshot",
        description:
          "The source keeps running (paused briefly: live when it was spawned with live_fork, else diff); a " +
          "paused source stays paused and its children start from its paused state. Each " +
          "child succeeds or fails on its own: 201 with one entry per child. Children inherit the source's " +
          "metadata, env and egress policy (as it is now). The fork's snapshot is deleted once nothing uses it.",
        params: SandboxParams,
        body: ForkBody,
        response: { 201: ForkResponse, ...errorResponses },
      },
    },
    async (request, reply) => {
      const outcome = await servicesOf(request).sandboxes.fork(request.params.id, {
        count: request.body?.count ?? 1,
        timeoutMs: request.body?.timeout_ms,
        signal: clientSignal(request, reply),
      });
      request.auditIds.push(outcome.tag);
      for (const child of outcome.children) if (child.sandbox) request.auditIds.push(child.sandbox.id);
      return reply.status(201).send({
        snapshot_tag: outcome.tag,
        mode: outcome.mode,
        pause_ms: outcome.pause_ms,
        children: outcome.children.map((child) =>
          child.sandbox
            ? { sandbox: sandboxToWire(child.sandbox), error: null }
            : { sandbox: null, error: { error: child.error.message, code: child.error.code } },
        ),
      });
    },
  );

  app.get<{ Params: Static<typeof SandboxParams>; Querystring: Static<typeof ConsoleQuery> }>(
    "/v1/sandboxes/:id/console",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "The end of the sandbox's serial console",
        description:
          "The guest's serial output as the host kept it: a bounded log per sandbox (forkd daemon --console-log-kib, " +
          "4 MiB by default), older output dropped first; control characters removed. Kept across daemon restarts.",
        params: SandboxParams,
        querystring: ConsoleQuery,
        produces: ["text/plain"],
        response: { 200: { type: "string" }, ...errorResponses },
      },
    },
    async (request, reply) => {
      const text = await servicesOf(request).sandboxes.console(request.params.id, request.query.bytes);
      return reply.type("text/plain; charset=utf-8").send(text);
    },
  );

  app.get(
    "/v1/confinement",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "How this daemon confines its sandboxes (uids, seccomp, cgroups, disk and console bounds)",
        response: { 200: ConfinementStatusWire, ...errorResponses },
      },
    },
    async (request) => servicesOf(request).sandboxes.confinementStatus(),
  );

  app.get<IdRequest>(
    "/v1/sandboxes/:id/metrics",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "What the sandbox uses now (CPU from the host, memory from the guest)",
        params: SandboxParams,
        response: { 200: SandboxMetricsWire, ...errorResponses },
      },
    },
    async (request, reply) =>
      servicesOf(request).sandboxes.metrics(request.params.id, {
        signal: clientSignal(request, reply),
      }),
  );
}

/** Guest-side timeout of an exec/eval: timeout_ms or v0.5's timeout_secs (not both); `fallbackSecs` otherwise. */
export function timeoutMsOf(
  body: { timeout_ms?: number; timeout_secs?: number },
  fallbackSecs: number | undefined,
): number | undefined {
  if (body.timeout_ms !== undefined && body.timeout_secs !== undefined) {
    throw invalidArgument("give timeout_ms or timeout_secs, not both");
  }
  if (body.timeout_ms !== undefined) return body.timeout_ms;
  if (body.timeout_secs !== undefined) return body.timeout_secs * 1000;
  return fallbackSecs === undefined ? undefined : fallbackSecs * 1000;
}

export function execOptions(body: Static<typeof ExecBody>) {
  if (body.cwd !== undefined && !body.cwd.startsWith("/")) {
    throw invalidArgument(
      `invalid body field "cwd": must be an absolute path, got ${JSON.stringify(body.cwd)}`,
    );
  }
  const bytes = Buffer.byteLength(JSON.stringify([body.args, body.env ?? {}, body.cwd ?? ""]));
  if (bytes > MAX_EXEC_REQUEST_BYTES) {
    throw new ForkdError(
      "payload_too_large",
      `args, env and cwd take ${bytes} bytes; at most ${MAX_EXEC_REQUEST_BYTES} fit in one exec ` +
        "(pass large inputs through stdin or a file)",
    );
  }
  return {
    timeoutMs: timeoutMsOf(body, DEFAULT_EXEC_TIMEOUT_SECS),
    env: body.env,
    cwd: body.cwd,
  };
}

function stdinOf(body: Static<typeof ExecBody>): Buffer | undefined {
  if (body.stdin !== undefined && body.stdin_b64 !== undefined) {
    throw invalidArgument("give stdin or stdin_b64, not both");
  }
  if (body.stdin !== undefined) return Buffer.from(body.stdin, "utf8");
  if (body.stdin_b64 !== undefined) {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(body.stdin_b64)) {
      throw new ForkdError("invalid_argument", 'invalid body field "stdin_b64": not base64');
    }
    return Buffer.from(body.stdin_b64, "base64");
  }
  return undefined;
}
