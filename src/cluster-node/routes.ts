/**
 * The node daemon's cluster routes (NODE_ROUTES), mounted on its listeners as an API extension: the event stream
 * the gateway builds its directory from, registry pull and push (one pull per digest at a time), and the warm
 * pools the controller asks for. Admin calls only (the gateway and the controller act as admins here; a tenant's
 * call is 403), hidden from the daemon's OpenAPI document.
 */
import type http from "node:http";
import { type Static, Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { ApiExtension } from "../api/extensions.js";
import { ndjsonLine } from "../api/ndjson.js";
import {
  EVENT_HEARTBEAT_MS,
  EVENT_POLL_MS,
  NODE_ROUTES,
  type NodeEvent,
  type PullAnswer,
  type PushAnswer,
  type SandboxRef,
  type SnapshotRef,
} from "../cluster/protocol.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { SANDBOX_ID_PATTERN, TAG_PATTERN } from "../common/limits.js";
import { IMAGE_REFERENCE } from "../common/names.js";
import type { SandboxInfo, SnapshotInfo } from "../controller/sandbox-service.js";
import type { Services } from "../controller/tenancy/tenant-view.js";
import { adminServicesOf, clientSignal } from "../http/request-scope.js";
import type { HeldDigests } from "./digests.js";
import type { DurablePauses } from "./durable-pauses.js";
import type { NodeMembership } from "./membership.js";
import { registryFailure } from "./registry-errors.js";

const DIGEST = "^sha256:[0-9a-f]{64}$";

const PullSchema = Type.Object(
  {
    reference: Type.String({ pattern: IMAGE_REFERENCE.source, maxLength: 1024 }),
    digest: Type.String({ pattern: DIGEST }),
    tag: Type.String({ pattern: TAG_PATTERN }),
    aliases: Type.Optional(Type.Array(Type.String({ pattern: TAG_PATTERN }), { maxItems: 32 })),
    insecure: Type.Optional(Type.Boolean()),
    owner: Type.Optional(Type.Union([Type.Null(), Type.String({ pattern: "^[a-z0-9][a-z0-9_-]{0,62}$" })])),
  },
  { additionalProperties: false },
);

const PushSchema = Type.Object(
  {
    tag: Type.String({ pattern: TAG_PATTERN }),
    reference: Type.String({ pattern: IMAGE_REFERENCE.source, maxLength: 1024 }),
    insecure: Type.Optional(Type.Boolean()),
    without_image: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
);

const PoolSchema = Type.Object(
  { size: Type.Integer({ minimum: 0, maximum: 256 }) },
  { additionalProperties: false },
);

/** Snapshots are read from disk: less often than sandboxes (an in-memory list). */
const SNAPSHOT_POLL_MS = 2_000;
/** Event streams open at once (the gateway's replicas, the controller, a few tools). */
const MAX_EVENT_STREAMS = 32;

export interface ClusterRoutesOptions {
  membership: NodeMembership;
  digests: HeldDigests;
  durable: DurablePauses;
  /** Sets a snapshot's warm pool (0 drains it); undefined when the daemon cannot pool (confinement on). */
  setPool?: (tag: string, size: number) => void;
}

export function clusterRoutesExtension(options: ClusterRoutesOptions): ApiExtension {
  const streams = new Set<http.ServerResponse>();
  const pulls = new Map<string, Promise<PullAnswer>>();
  return {
    async register(app: FastifyInstance) {
      app.addHook("preClose", async () => {
        for (const res of streams) res.end();
      });
      registerEventRoute(app, options, streams);
      app.post<{ Body: Static<typeof PullSchema> }>(
        NODE_ROUTES.pull,
        { schema: { hide: true, body: PullSchema } },
        async (request) => pull(request, adminServicesOf(request, "pulling a snapshot"), options, pulls),
      );
      app.post<{ Body: Static<typeof PushSchema> }>(
        NODE_ROUTES.push,
        { schema: { hide: true, body: PushSchema } },
        async (request, reply) =>
          push(
            adminServicesOf(request, "pushing a snapshot"),
            options,
            request.body,
            clientSignal(request, reply),
          ),
      );
      registerPoolRoute(app, options);
      registerDurablePauseRoute(app, options);
    },
    async close() {
      for (const res of streams) res.end();
    },
  };
}

/** The event stream the gateway builds its directory from (at most MAX_EVENT_STREAMS open). */
function registerEventRoute(
  app: FastifyInstance,
  options: ClusterRoutesOptions,
  streams: Set<http.ServerResponse>,
): void {
  app.get(NODE_ROUTES.events, { schema: { hide: true } }, async (request, reply) => {
    const services = adminServicesOf(request, "the cluster event stream");
    if (streams.size >= MAX_EVENT_STREAMS) {
      throw new ForkdError("unavailable", "too many cluster event streams are open");
    }
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, {
      "content-type": "application/x-ndjson",
      "cache-control": "no-store",
      "x-request-id": request.id,
    });
    streams.add(res);
    res.on("close", () => streams.delete(res));
    void streamEvents(res, services, options, clientSignal(request, reply));
  });
}

/** Pushes `tag` to the registry and records its digest (what the node's ForkdNode lists as held). */
async function push(
  services: Services,
  options: ClusterRoutesOptions,
  body: Static<typeof PushSchema>,
  signal: AbortSignal,
): Promise<PushAnswer> {
  const { tag, reference, insecure, without_image } = body;
  try {
    const pushed = await services.snapshots.push({
      tag,
      reference,
      insecure,
      withoutImage: without_image,
      signal,
    });
    const info = await services.snapshots.get(tag);
    await options.digests.record(tag, {
      digest: pushed.digest,
      reference: pushed.reference,
      created_at_unix: info.created_at_unix,
    });
    return {
      tag,
      reference: pushed.reference,
      digest: pushed.digest,
      uploaded_bytes: pushed.uploaded_bytes,
      ms: pushed.ms,
    };
  } catch (err) {
    throw registryFailure(reference, err);
  }
}

/** A paused sandbox made durable: pushed to the cluster's registry, listed in the ForkdNode (durable-pauses.ts). */
function registerDurablePauseRoute(app: FastifyInstance, options: ClusterRoutesOptions): void {
  app.post<{ Params: { id: string } }>(
    `${NODE_ROUTES.durablePauses}/:id`,
    {
      schema: { hide: true, params: Type.Object({ id: Type.String({ pattern: SANDBOX_ID_PATTERN }) }) },
    },
    async (request) => {
      const services = adminServicesOf(request, "durable pauses");
      const { membership } = options;
      return options.durable.push(services, request.params.id, membership.epoch, () =>
        membership.publishNow(),
      );
    },
  );
}

/** The warm pools the controller asks for. */
function registerPoolRoute(app: FastifyInstance, options: ClusterRoutesOptions): void {
  app.put<{ Params: { tag: string }; Body: Static<typeof PoolSchema> }>(
    `${NODE_ROUTES.pools}/:tag`,
    {
      schema: {
        hide: true,
        params: Type.Object({ tag: Type.String({ pattern: TAG_PATTERN }) }),
        body: PoolSchema,
      },
    },
    async (request) => {
      const services = adminServicesOf(request, "warm pools");
      if (!options.setPool) {
        throw new ForkdError(
          "not_implemented",
          "this node keeps no warm pools (its sandbox manager has none)",
        );
      }
      await services.snapshots.get(request.params.tag);
      options.setPool(request.params.tag, request.body.size);
      return { tag: request.params.tag, size: request.body.size };
    },
  );
}

/** Pulls `reference@digest` as `tag` unless the node holds it; concurrent pulls of one digest share one. */
async function pull(
  request: FastifyRequest<{ Body: Static<typeof PullSchema> }>,
  services: Services,
  options: ClusterRoutesOptions,
  pulls: Map<string, Promise<PullAnswer>>,
): Promise<PullAnswer> {
  const { reference, digest, tag, aliases, insecure, owner } = request.body;
  const running = pulls.get(digest);
  if (running) return { ...(await running), pulled: false };
  const work = (async (): Promise<PullAnswer> => {
    const started = performance.now();
    const existing = await services.snapshots.get(tag).catch(() => undefined);
    const held = existing ? options.digests.of(tag, existing.created_at_unix) : undefined;
    if (existing && held?.digest === digest) {
      await setAliases(services, tag, aliases ?? []);
      return { tag, digest, installed: [], pulled: false, ms: Math.round(performance.now() - started) };
    }
    if (existing) {
      throw new ForkdError(
        "conflict",
        `node ${options.membership.nodeName} has a snapshot ${tag} that is not ${digest}: delete it first`,
      );
    }
    let result: Awaited<ReturnType<Services["snapshots"]["pull"]>>;
    try {
      result = await services.snapshots.pull({ reference, digest, tag, insecure, owner });
    } catch (err) {
      throw registryFailure(reference, err);
    }
    const info = await services.snapshots.get(tag);
    await options.digests.record(tag, { digest, reference, created_at_unix: info.created_at_unix });
    await setAliases(services, tag, aliases ?? []);
    return {
      tag,
      digest,
      installed: result.installed,
      pulled: true,
      ms: Math.round(performance.now() - started),
    };
  })();
  pulls.set(digest, work);
  try {
    return await work;
  } finally {
    pulls.delete(digest);
  }
}

async function setAliases(services: Services, tag: string, aliases: readonly string[]): Promise<void> {
  for (const alias of aliases) {
    if (alias === tag) continue;
    const current = await services.snapshots.aliases.get(alias).catch(() => undefined);
    if (current?.tag === tag) continue;
    await services.snapshots.aliases.set(alias, tag);
  }
}

const sandboxRef = (s: SandboxInfo): SandboxRef => ({
  id: s.id,
  status: s.status,
  owner: s.owner,
  snapshot_tag: s.snapshot_tag,
  created_at_unix: s.created_at_unix,
});

function snapshotRef(s: SnapshotInfo, digests: HeldDigests): SnapshotRef {
  return { tag: s.tag, owner: s.owner, digest: digests.of(s.tag, s.created_at_unix)?.digest ?? null };
}

/**
 * Writes the node's whole state, then each change (polled: the sandbox list every EVENT_POLL_MS, snapshots every
 * SNAPSHOT_POLL_MS), with heartbeats on a quiet stream. Ends when the client goes or the node's epoch changes
 * (a fence): the gateway then reconnects and gets the new state.
 */
async function streamEvents(
  res: http.ServerResponse,
  services: Services,
  options: ClusterRoutesOptions,
  signal: AbortSignal,
): Promise<void> {
  const { membership, digests } = options;
  const epoch = membership.epoch;
  const write = (event: NodeEvent) => {
    if (!res.writableEnded) res.write(ndjsonLine(event));
  };
  try {
    const sandboxes = new Map<string, string>();
    const snapshots = new Map<string, string>();
    const sandboxList = services.sandboxes.list().map(sandboxRef);
    const snapshotList = (await services.snapshots.list()).map((s) => snapshotRef(s, digests));
    for (const s of sandboxList) sandboxes.set(s.id, JSON.stringify(s));
    for (const s of snapshotList) snapshots.set(s.tag, JSON.stringify(s));
    write({
      type: "state",
      node: membership.nodeName,
      epoch,
      sandboxes: sandboxList,
      snapshots: snapshotList,
    });
    let lastWrite = Date.now();
    let lastSnapshots = Date.now();
    while (!signal.aborted && !res.writableEnded && membership.epoch === epoch) {
      await new Promise((resolve) => setTimeout(resolve, EVENT_POLL_MS));
      let wrote = diff(
        sandboxes,
        services.sandboxes.list().map(sandboxRef),
        (s) => s.id,
        (sandbox) => write({ type: "sandbox", sandbox }),
        (id) => write({ type: "sandbox-gone", id }),
      );
      if (Date.now() - lastSnapshots >= SNAPSHOT_POLL_MS) {
        lastSnapshots = Date.now();
        const list = (await services.snapshots.list()).map((s) => snapshotRef(s, digests));
        wrote =
          diff(
            snapshots,
            list,
            (s) => s.tag,
            (snapshot) => write({ type: "snapshot", snapshot }),
            (tag) => write({ type: "snapshot-gone", tag }),
          ) || wrote;
      }
      if (wrote) lastWrite = Date.now();
      else if (Date.now() - lastWrite >= EVENT_HEARTBEAT_MS) {
        write({ type: "heartbeat", epoch });
        lastWrite = Date.now();
      }
    }
  } catch (err) {
    res.destroy(new Error(errorMessage(err)));
    return;
  }
  res.end();
}

/** Updates `known` (key -> JSON) to `next`, reporting each change; true when something changed. */
function diff<T>(
  known: Map<string, string>,
  next: readonly T[],
  keyOf: (value: T) => string,
  changed: (value: T) => void,
  gone: (key: string) => void,
): boolean {
  let any = false;
  const seen = new Set<string>();
  for (const value of next) {
    const key = keyOf(value);
    seen.add(key);
    const json = JSON.stringify(value);
    if (known.get(key) !== json) {
      known.set(key, json);
      changed(value);
      any = true;
    }
  }
  for (const key of [...known.keys()]) {
    if (!seen.has(key)) {
      known.delete(key);
      gone(key);
      any = true;
    }
  }
  return any;
}
