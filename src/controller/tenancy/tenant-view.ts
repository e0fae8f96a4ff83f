/**
 * Tenancy: what one tenant's token may see and touch, enforced once, as a view of the daemon's services that
 * every API surface (the forkd REST routes, the E2B control plane, and through them the SDKs, the CLI over TCP
 * and the MCP server) calls instead of the services themselves.
 *
 * - An admin (a token without a tenant, the Unix socket, a listener without tokens) gets the services as they are.
 * - A tenant sees its own sandboxes and snapshots, and the daemon's shared templates: snapshots an admin made
 *   that are neither BRANCHed from a sandbox nor the daemon's own fork points. It may spawn from those, never
 *   change them. Everything else does not exist for it: 404 with the same message an unknown name gets, absent
 *   from lists, and never named in an error.
 * - What a tenant creates is its own: sandboxes it spawns, and the forks, BRANCHes and snapshots of them (the
 *   manager gives a BRANCH the owner of the sandbox it comes from), snapshots it builds or compacts, aliases it sets.
 *
 * Names (snapshot tags, template aliases) are one namespace per daemon: a tenant that picks a name another holds
 * is refused (409) and learns only that the name is taken.
 */
import { conflict, ForkdError, notFound } from "../../common/errors.js";
import { isValidTag } from "../../common/names.js";
import type { TemplateBuildService } from "../builds/contract.js";
import type {
  SandboxInfo,
  SandboxService,
  SnapshotDeleteOptions,
  SnapshotDetail,
  SnapshotInfo,
  SnapshotService,
} from "../sandbox-service.js";
import { assertAlias, type TemplateAlias } from "../snapshots/template-aliases.js";
import { tenantBuilds } from "./build-view.js";
import { oneSandboxView } from "./sandbox-view.js";

/** Who a request acts for, resolved once when it is authenticated. */
export interface Principal {
  /** The caller's tenant; null: an admin, who sees everything. */
  tenant: string | null;
  /**
   * The one sandbox the request is confined to, within its tenant's view (sandbox-view.ts): a request opened by
   * that sandbox's own access tokens (the E2B data plane). Absent: the tenant's whole view.
   */
  sandbox?: string;
}

export const ADMIN: Principal = Object.freeze({ tenant: null });

/** Per-tenant limits of one daemon (`forkd daemon --tenant-max-sandboxes`); admins have none. */
export interface TenantLimits {
  /** Sandboxes (not dead) one tenant may hold at once, spawns and forks in flight counted. */
  maxSandboxes?: number;
}

interface LimitState extends TenantLimits {
  /** Children of each tenant's spawns and forks admitted and not yet answered. */
  inFlight: Map<string, number>;
}

const limitsByService = new WeakMap<SandboxService, LimitState>();

/** Sets the per-tenant limits of the daemon whose sandboxes `sandboxes` are. */
export function limitTenants(sandboxes: SandboxService, limits: TenantLimits): void {
  limitsByService.set(sandboxes, { ...limits, inFlight: new Map() });
}

export interface Services {
  sandboxes: SandboxService;
  snapshots: SnapshotService;
  /** Template builds (absent where no daemon composes them: the E2B template routes then answer 501). */
  builds?: TemplateBuildService;
}

/**
 * The services as `principal` may use them: unchanged for an admin, a tenant's view otherwise, narrowed to one
 * sandbox for a principal confined to it.
 */
export function servicesFor(services: Services, principal: Principal): Services {
  const tenantView = principal.tenant === null ? services : tenantScope(services, principal.tenant);
  return principal.sandbox === undefined ? tenantView : oneSandboxView(tenantView, principal.sandbox);
}

function tenantScope(services: Services, tenant: string): Services {
  const scope = new TenantScope(services, tenant);
  return {
    sandboxes: scope.sandboxes(),
    snapshots: scope.snapshots(),
    ...(services.builds ? { builds: tenantBuilds(services.builds, tenant) } : {}),
  };
}

/** A snapshot an admin made as a template: every tenant may see it and spawn from it. */
export function isSharedTemplate(s: Pick<SnapshotInfo, "owner" | "ephemeral" | "source_sandbox">): boolean {
  return s.owner === null && !s.ephemeral && s.source_sandbox === null;
}

const workspaceNotFound = (name: string) => notFound(`workspace ${name} not found`);

/**
 * v0.5 workspaces are named per daemon and v0.5 had no tenants: they stay an admin's tool, and a tenant sees none
 * (its own sandboxes pause and resume through the sandbox routes instead).
 */
function adminOnlyWorkspaces(): SandboxService["workspaces"] {
  const refuse = async (name: string): Promise<never> => {
    throw workspaceNotFound(name);
  };
  return {
    list: () => [],
    get: (name) => {
      throw workspaceNotFound(name);
    },
    create: async () => {
      throw new ForkdError(
        "forbidden",
        "workspaces are an admin's: a tenant pauses and resumes its sandboxes instead",
      );
    },
    suspend: refuse,
    resume: refuse,
    delete: refuse,
  };
}

const sandboxNotFound = (id: string) => notFound(`sandbox ${id} not found`);
const snapshotNotFound = (tag: string) => notFound(`snapshot ${JSON.stringify(tag)} not found`);
const aliasNotFound = (alias: string) => notFound(`template alias ${JSON.stringify(alias)} not found`);

class TenantScope {
  constructor(
    private readonly inner: Services,
    private readonly tenant: string,
  ) {}

  // ---- what the tenant may see

  /** The sandbox if it is the tenant's; not_found (as for an unknown id) otherwise. */
  private own(id: string): SandboxInfo {
    const info = this.inner.sandboxes.get(id);
    if (info.owner !== this.tenant) throw sandboxNotFound(id);
    return info;
  }

  private visibleSnapshot(s: SnapshotInfo): boolean {
    return s.owner === this.tenant || isSharedTemplate(s);
  }

  private async snapshot(tag: string): Promise<SnapshotInfo> {
    const info = await this.inner.snapshots.get(tag);
    if (!this.visibleSnapshot(info)) throw snapshotNotFound(tag);
    return info;
  }

  /** A snapshot the tenant may change: its own; a shared template is visible but forbidden. */
  private async ownSnapshot(tag: string): Promise<SnapshotInfo> {
    const info = await this.snapshot(tag);
    if (info.owner !== this.tenant) {
      throw new ForkdError(
        "forbidden",
        `snapshot ${JSON.stringify(tag)} is one of the daemon's shared templates: only an admin can change it`,
      );
    }
    return info;
  }

  /** The tenant's own aliases and the admin's aliases of shared templates. */
  private async visibleAliases(): Promise<TemplateAlias[]> {
    const all = await this.inner.snapshots.aliases.list();
    if (!all.some((a) => a.owner === null)) return all.filter((a) => a.owner === this.tenant);
    const shared = new Set(
      (await this.inner.snapshots.list()).filter((s) => isSharedTemplate(s)).map((s) => s.tag),
    );
    return all.filter((a) => a.owner === this.tenant || (a.owner === null && shared.has(a.tag)));
  }

  /** `alias` if the tenant may set it: free, or its own already. */
  private async claimableAlias(alias: string): Promise<void> {
    assertAlias(alias);
    const existing = (await this.inner.snapshots.aliases.list()).find((a) => a.alias === alias);
    if (existing === undefined || existing.owner === this.tenant) return;
    if ((await this.visibleAliases()).some((a) => a.alias === alias)) {
      throw new ForkdError(
        "forbidden",
        `template alias ${JSON.stringify(alias)} names one of the daemon's shared templates: only an admin can change it`,
      );
    }
    throw conflict(`template alias ${JSON.stringify(alias)} is taken`);
  }

  /** A snapshot as the tenant sees it: only the aliases it may see (`visible`: those, when already known). */
  private async scrub<T extends SnapshotInfo>(info: T, visible?: Set<string>): Promise<T> {
    const aliases = visible ?? new Set((await this.visibleAliases()).map((a) => a.alias));
    return { ...info, aliases: info.aliases.filter((a) => aliases.has(a)) };
  }

  private async scrubDetail(detail: SnapshotDetail): Promise<SnapshotDetail> {
    const visible = new Set(
      (await this.inner.snapshots.list()).filter((s) => this.visibleSnapshot(s)).map((s) => s.tag),
    );
    return {
      ...(await this.scrub(detail)),
      dependents: detail.dependents.filter((t) => visible.has(t)),
      all_dependents: detail.all_dependents.filter((t) => visible.has(t)),
    };
  }

  /** A conflict from deleting a snapshot, naming only what the tenant may see. */
  private deleteConflict(tag: string, err: ForkdError): ForkdError {
    const mine = (ids: unknown) =>
      (Array.isArray(ids) ? ids : []).filter(
        (id): id is string => typeof id === "string" && this.ownsSandbox(id),
      );
    if (Array.isArray(err.detail?.sandboxes) || Array.isArray(err.detail?.pids)) {
      const sandboxes = mine(err.detail?.sandboxes);
      const named = sandboxes.length > 0 ? `: sandboxes ${sandboxes.join(", ")}` : "";
      return conflict(`snapshot ${JSON.stringify(tag)} is in use by running VMs (kill them first)${named}`, {
        sandboxes,
      });
    }
    return conflict(
      `snapshot ${JSON.stringify(tag)} has dependents (delete them first, or use --cascade to delete them too, ` +
        "or --force to leave them orphaned and unbootable)",
    );
  }

  private ownsSandbox(id: string): boolean {
    try {
      return this.inner.sandboxes.get(id).owner === this.tenant;
    } catch {
      return false;
    }
  }

  // ---- the views

  sandboxes(): SandboxService {
    const inner = this.inner.sandboxes;
    const tenant = this.tenant;
    /** `fn` on a sandbox of the tenant's; anyone else's is not found. */
    const mine =
      <A extends unknown[], R>(fn: (id: string, ...args: A) => R) =>
      (id: string, ...args: A): R => {
        this.own(id);
        return fn(id, ...args);
      };
    return {
      spawn: async (request) => {
        await this.snapshot(request.snapshotTag);
        return this.admitted(request.n, () => inner.spawn({ ...request, owner: tenant }));
      },
      branchLoad: () => inner.branchLoad(),
      list: (filter) => inner.list(filter).filter((s) => s.owner === tenant),
      get: (id) => this.own(id),
      kill: mine((id) => inner.kill(id)),
      pause: mine((id, request?: Parameters<SandboxService["pause"]>[1]) => inner.pause(id, request)),
      resume: mine((id, request?: Parameters<SandboxService["resume"]>[1]) => inner.resume(id, request)),
      workspaces: adminOnlyWorkspaces(),
      killAll: (filter) => this.killAllOwn(filter),
      setTimeout: mine((id, ms: number) => inner.setTimeout(id, ms)),
      extendTimeout: mine((id, ms: number) => inner.extendTimeout(id, ms)),
      accessTokens: mine((id) => inner.accessTokens(id)),
      verifyAccessToken: (id, kind, token) =>
        this.ownsSandbox(id) && inner.verifyAccessToken(id, kind, token),
      envVars: mine((id) => inner.envVars(id)),
      metrics: mine((id, options?: { signal?: AbortSignal }) => inner.metrics(id, options)),
      metricsHistory: mine((id, range?: Parameters<SandboxService["metricsHistory"]>[1]) =>
        inner.metricsHistory(id, range),
      ),
      networkStatus: () => inner.networkStatus(),
      confinementStatus: () => inner.confinementStatus(),
      usage: (filter) => this.ownUsage(filter),
      // Its sandbox counts describe every tenant's activity, like /metrics.
      host: async () => {
        throw new ForkdError(
          "forbidden",
          "the host's status is for admins (it counts every tenant's sandboxes)",
        );
      },
      console: mine((id, maxBytes?: number) => inner.console(id, maxBytes)),
      setNetworkPolicy: mine((id, policy: Parameters<SandboxService["setNetworkPolicy"]>[1]) =>
        inner.setNetworkPolicy(id, policy),
      ),
      proxyHttp: mine((id, ...rest: DropFirst<Parameters<SandboxService["proxyHttp"]>>) =>
        inner.proxyHttp(id, ...rest),
      ),
      proxyUpgrade: mine((id, ...rest: DropFirst<Parameters<SandboxService["proxyUpgrade"]>>) =>
        inner.proxyUpgrade(id, ...rest),
      ),
      ping: mine((id, options?: { signal?: AbortSignal }) => inner.ping(id, options)),
      exec: mine((id, ...rest: DropFirst<Parameters<SandboxService["exec"]>>) => inner.exec(id, ...rest)),
      eval: mine((id, ...rest: DropFirst<Parameters<SandboxService["eval"]>>) => inner.eval(id, ...rest)),
      fork: mine((id, request: Parameters<SandboxService["fork"]>[1]) =>
        this.admitted(request.count, () => inner.fork(id, request)),
      ),
      branch: async (id, request) => {
        this.own(id);
        if (request.alias !== undefined) await this.claimableAlias(request.alias);
        return inner.branch(id, request);
      },
      snapshotDiff: async (request) => {
        await this.snapshot(request.from);
        return inner.snapshotDiff({ ...request, owner: tenant });
      },
      procs: wrapAll(inner.procs, (id) => this.own(id)),
      contexts: wrapAll(inner.contexts, (id) => this.own(id)),
      files: wrapAll(inner.files, (id) => this.own(id)),
    };
  }

  snapshots(): SnapshotService {
    const inner = this.inner.snapshots;
    const tenant = this.tenant;
    return {
      list: async () => {
        const visible = (await inner.list()).filter((s) => this.visibleSnapshot(s));
        const aliases = new Set((await this.visibleAliases()).map((a) => a.alias));
        return Promise.all(visible.map((s) => this.scrub(s, aliases)));
      },
      get: async (tag) => this.scrub(await this.snapshot(tag)),
      detail: async (tag) => {
        await this.snapshot(tag);
        return this.scrubDetail(await inner.detail(tag));
      },
      create: async (request) => this.scrub(await inner.create({ ...request, owner: tenant })),
      delete: (tag, options) => this.deleteOwn(tag, options),
      compact: async (request) => {
        await this.snapshot(request.from);
        return this.scrub(await inner.compact({ ...request, owner: tenant }));
      },
      pack: async (request) => {
        await this.snapshot(request.tag);
        return inner.pack(request);
      },
      unpack: async () => {
        throw new ForkdError(
          "forbidden",
          "unpack is for admins: a pack installs snapshots and guest images every tenant's sandboxes could use",
        );
      },
      pull: async () => {
        throw new ForkdError(
          "forbidden",
          "pull is for admins: it installs snapshots and guest images every tenant's sandboxes could use",
        );
      },
      push: async (request) => {
        await this.snapshot(request.tag);
        return inner.push(request);
      },
      retire: async (tag) => {
        await this.ownSnapshot(tag);
        return inner.retire(tag);
      },
      aliases: this.aliases(),
      resolveTemplate: async (name, options = {}) => {
        assertAlias(name);
        const alias = (await this.visibleAliases()).find((a) => a.alias === name);
        if (alias) return { tag: (await this.snapshot(alias.tag)).tag, alias: name };
        if (isValidTag(name) && (await this.snapshot(name).catch(() => null)))
          return { tag: name, alias: null };
        if (options.orDefault) {
          const tag = await this.defaultTemplate();
          if (tag !== null) return { tag, alias: name };
          throw notFound(
            `template ${JSON.stringify(name)} not found: it means the daemon's default snapshot, and there is none`,
          );
        }
        throw notFound(`template ${JSON.stringify(name)} not found (no alias or snapshot of that name)`);
      },
      defaultTemplate: () => this.defaultTemplate(),
    };
  }

  /** Kills the tenant's sandboxes (of one snapshot, if given); returns the ids killed. */
  private async killAllOwn(filter?: { snapshotTag?: string }): Promise<string[]> {
    const inner = this.inner.sandboxes;
    const killed: string[] = [];
    for (const sb of inner.list(filter).filter((s) => s.owner === this.tenant)) {
      try {
        await inner.kill(sb.id);
        killed.push(sb.id);
      } catch (err) {
        // Killed meanwhile by another request: gone either way.
        if (!(err instanceof ForkdError && err.code === "not_found")) throw err;
      }
    }
    return killed;
  }

  /** Host-side use of the tenant's sandboxes (all, or those of `ids` that are its own). */
  private async ownUsage(filter?: { ids?: readonly string[] }) {
    const inner = this.inner.sandboxes;
    const own = inner
      .list()
      .filter((s) => s.owner === this.tenant)
      .map((s) => s.id);
    const ids = filter?.ids === undefined ? own : filter.ids.filter((id) => own.includes(id));
    return inner.usage({ ids });
  }

  /** Deletes a snapshot of the tenant's; cascading only when everything that depends on it is its own too. */
  private async deleteOwn(tag: string, options: SnapshotDeleteOptions = {}) {
    const inner = this.inner.snapshots;
    await this.ownSnapshot(tag);
    if (options.cascade) {
      // Cascading would delete what depends on it: only when all of that is the tenant's too.
      const detail = await inner.detail(tag);
      const owners = new Map((await inner.list()).map((s) => [s.tag, s.owner]));
      if (detail.all_dependents.some((t) => owners.get(t) !== this.tenant)) {
        throw conflict(`snapshot ${JSON.stringify(tag)} has dependents that are not yours`);
      }
    }
    try {
      return await inner.delete(tag, options);
    } catch (err) {
      if (err instanceof ForkdError && err.code === "conflict") throw this.deleteConflict(tag, err);
      throw err;
    }
  }

  /** Template aliases as the tenant sees them: its own and the shared templates' (those read-only). */
  private aliases(): SnapshotService["aliases"] {
    const inner = this.inner.snapshots;
    const tenant = this.tenant;
    return {
      list: () => this.visibleAliases(),
      get: async (alias) => {
        assertAlias(alias);
        const row = (await this.visibleAliases()).find((a) => a.alias === alias);
        if (!row) throw aliasNotFound(alias);
        return row;
      },
      set: async (alias, tag) => {
        await this.claimableAlias(alias);
        await this.snapshot(tag);
        return inner.aliases.set(alias, tag, tenant);
      },
      delete: async (alias) => {
        assertAlias(alias);
        const row = (await inner.aliases.list()).find((a) => a.alias === alias);
        if (row === undefined || (row.owner !== tenant && row.owner !== null)) throw aliasNotFound(alias);
        if (row.owner === null) {
          throw new ForkdError(
            "forbidden",
            `template alias ${JSON.stringify(alias)} is the daemon's: only an admin can delete it`,
          );
        }
        inner.aliases.delete(alias);
      },
    };
  }

  /**
   * Runs `create` (which makes `n` sandboxes of the tenant's) within its --tenant-max-sandboxes, counted before
   * the first await so concurrent requests see each other; 429 beyond it. While `create` runs its rows may be
   * counted twice: that errs on refusing.
   */
  private async admitted<T>(n: number, create: () => Promise<T>): Promise<T> {
    const limits = limitsByService.get(this.inner.sandboxes);
    if (limits?.maxSandboxes === undefined || !Number.isInteger(n) || n < 1) return create();
    const held = this.inner.sandboxes
      .list()
      .filter((s) => s.owner === this.tenant && s.status !== "dead").length;
    const inFlight = limits.inFlight.get(this.tenant) ?? 0;
    if (held + inFlight + n > limits.maxSandboxes) {
      throw new ForkdError(
        "too_many_requests",
        `this tenant holds ${held} sandboxes${inFlight > 0 ? ` (${inFlight} more starting)` : ""}; ` +
          `${n} more would exceed its limit of ${limits.maxSandboxes} (--tenant-max-sandboxes): kill some first`,
      );
    }
    limits.inFlight.set(this.tenant, inFlight + n);
    try {
      return await create();
    } finally {
      const left = (limits.inFlight.get(this.tenant) ?? n) - n;
      if (left > 0) limits.inFlight.set(this.tenant, left);
      else limits.inFlight.delete(this.tenant);
    }
  }

  private async defaultTemplate(): Promise<string | null> {
    const tag = await this.inner.snapshots.defaultTemplate();
    if (tag === null) return null;
    return (await this.snapshot(tag).catch(() => null)) ? tag : null;
  }
}

type DropFirst<T extends unknown[]> = T extends [unknown, ...infer Rest] ? Rest : never;

/** Every method of `group` (whose first argument is a sandbox id) behind `check(id)`. */
function wrapAll<G extends object>(group: G, check: (id: string) => void): G {
  const wrapped: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(group)) {
    if (typeof fn !== "function") continue;
    wrapped[name] = (id: string, ...args: unknown[]) => {
      check(id);
      return (fn as (...a: unknown[]) => unknown).call(group, id, ...args);
    };
  }
  return wrapped as G;
}
