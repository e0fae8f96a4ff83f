/**
 * One sandbox's view of the services: what a request opened by a sandbox's own access tokens may reach (the
 * E2B data plane: envd, the code interpreter, the sandbox's ports). That sandbox's processes, files, interpreter,
 * ports, metrics, env vars and tokens, and its resume (autoResume); nothing else. Another id is not found, as an
 * unknown one is; lists show that sandbox alone; what would make or change anything beyond it (spawns, forks,
 * BRANCHes, kills, snapshots, aliases) is refused. tenant-view.ts composes it over its owner's view.
 */
import { ForkdError, notFound } from "../../common/errors.js";
import type { SandboxService, SnapshotService } from "../sandbox-service.js";

interface Services {
  sandboxes: SandboxService;
  snapshots: SnapshotService;
}

/** `services` as a request confined to sandbox `id` may use them. */
export function oneSandboxView(services: Services, id: string): Services {
  return { sandboxes: oneSandbox(services.sandboxes, id), snapshots: noSnapshots() };
}

const beyond = (what: string) =>
  new ForkdError(
    "forbidden",
    `${what}: a request opened by a sandbox's access token acts on that sandbox only`,
  );

function checkIs(id: string, other: string): void {
  if (other !== id) throw notFound(`sandbox ${other} not found`);
}

/** Every method of `group` (whose first argument is a sandbox id), for `id` only. */
function only<G extends object>(group: G, id: string): G {
  const wrapped: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(group)) {
    if (typeof fn !== "function") continue;
    wrapped[name] = (other: string, ...args: unknown[]) => {
      checkIs(id, other);
      return (fn as (...a: unknown[]) => unknown).call(group, other, ...args);
    };
  }
  return wrapped as G;
}

function oneSandbox(inner: SandboxService, id: string): SandboxService {
  const mine =
    <A extends unknown[], R>(fn: (sandbox: string, ...args: A) => R) =>
    (sandbox: string, ...args: A): R => {
      checkIs(id, sandbox);
      return fn(sandbox, ...args);
    };
  const refuse = (what: string) => async (): Promise<never> => {
    throw beyond(what);
  };
  const refuseNow = (what: string) => (): never => {
    throw beyond(what);
  };
  return {
    spawn: refuse("spawn"),
    branchLoad: () => inner.branchLoad(),
    list: (filter) => inner.list(filter).filter((s) => s.id === id),
    get: mine((sandbox) => inner.get(sandbox)),
    kill: refuse("kill"),
    pause: refuse("pause"),
    resume: mine((sandbox, request?: Parameters<SandboxService["resume"]>[1]) =>
      inner.resume(sandbox, request),
    ),
    workspaces: {
      list: () => [],
      get: (name) => {
        throw notFound(`workspace ${name} not found`);
      },
      create: refuse("workspaces"),
      suspend: refuse("workspaces"),
      resume: refuse("workspaces"),
      delete: refuse("workspaces"),
    },
    killAll: refuse("kill"),
    setTimeout: refuseNow("its lifetime"),
    extendTimeout: refuseNow("its lifetime"),
    accessTokens: mine((sandbox) => inner.accessTokens(sandbox)),
    verifyAccessToken: (sandbox, kind, token) =>
      sandbox === id && inner.verifyAccessToken(sandbox, kind, token),
    envVars: mine((sandbox) => inner.envVars(sandbox)),
    metrics: mine((sandbox, options?: { signal?: AbortSignal }) => inner.metrics(sandbox, options)),
    metricsHistory: mine((sandbox, range?: Parameters<SandboxService["metricsHistory"]>[1]) =>
      inner.metricsHistory(sandbox, range),
    ),
    console: mine((sandbox, maxBytes?: number) => inner.console(sandbox, maxBytes)),
    confinementStatus: () => inner.confinementStatus(),
    usage: async () => inner.usage({ ids: [id] }),
    host: refuse("the host's status"),
    networkStatus: () => inner.networkStatus(),
    setNetworkPolicy: refuse("its network policy"),
    proxyHttp: mine((sandbox, ...rest: DropFirst<Parameters<SandboxService["proxyHttp"]>>) =>
      inner.proxyHttp(sandbox, ...rest),
    ),
    proxyUpgrade: mine((sandbox, ...rest: DropFirst<Parameters<SandboxService["proxyUpgrade"]>>) =>
      inner.proxyUpgrade(sandbox, ...rest),
    ),
    ping: mine((sandbox, options?: { signal?: AbortSignal }) => inner.ping(sandbox, options)),
    exec: mine((sandbox, ...rest: DropFirst<Parameters<SandboxService["exec"]>>) =>
      inner.exec(sandbox, ...rest),
    ),
    eval: mine((sandbox, ...rest: DropFirst<Parameters<SandboxService["eval"]>>) =>
      inner.eval(sandbox, ...rest),
    ),
    fork: refuse("fork"),
    branch: refuse("BRANCH"),
    snapshotDiff: refuse("snapshot-diff"),
    procs: only(inner.procs, id),
    contexts: only(inner.contexts, id),
    files: only(inner.files, id),
  };
}

function noSnapshots(): SnapshotService {
  const refuse = (what: string) => async (): Promise<never> => {
    throw beyond(what);
  };
  return {
    list: async () => [],
    get: async (tag) => {
      throw notFound(`snapshot ${JSON.stringify(tag)} not found`);
    },
    detail: async (tag) => {
      throw notFound(`snapshot ${JSON.stringify(tag)} not found`);
    },
    create: refuse("snapshots"),
    delete: refuse("snapshots"),
    compact: refuse("snapshots"),
    pack: refuse("snapshots"),
    unpack: refuse("snapshots"),
    pull: refuse("snapshots"),
    push: refuse("snapshots"),
    retire: refuse("snapshots"),
    aliases: {
      list: async () => [],
      get: async (alias) => {
        throw notFound(`template alias ${JSON.stringify(alias)} not found`);
      },
      set: refuse("template aliases"),
      delete: refuse("template aliases"),
    },
    resolveTemplate: refuse("templates"),
    defaultTemplate: async () => null,
  };
}

type DropFirst<T extends unknown[]> = T extends [unknown, ...infer Rest] ? Rest : never;
