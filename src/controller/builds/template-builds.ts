/**
 * The daemon's template builds (TemplateBuildService): templates by name per tenant, their builds admitted
 * like any heavy work (at most `maxConcurrent` at once, the others waiting in order; each reserves the memory
 * its parent VM will use, or fails saying so), their logs, and the names of the newest ready build: the
 * template's name, its id and its `name:tag` aliases all name its snapshot, so `Sandbox.create(name)` starts
 * from it. A snapshot a newer build replaces is retired (deleted once no sandbox runs on it).
 *
 * Names are the daemon's template-alias namespace: a name another tenant's template or alias holds is refused
 * (409), and a tenant never sees another's templates (404, as an unknown name).
 */
import { randomUUID } from "node:crypto";
import path from "node:path";
import type { Readable } from "node:stream";
import { conflict, ForkdError, invalidArgument, notFound } from "../../common/errors.js";
import {
  DEFAULT_TEMPLATE_CPU_COUNT,
  DEFAULT_TEMPLATE_DISK_MIB,
  DEFAULT_TEMPLATE_MEMORY_MIB,
  MAX_TEMPLATE_CPU_COUNT,
  MAX_TEMPLATE_DISK_MIB,
  MAX_TEMPLATE_MEMORY_MIB,
  MIN_TEMPLATE_MEMORY_MIB,
} from "../../common/limits.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import { assertAlias } from "../snapshots/template-aliases.js";
import { type BuildFileLimits, BuildFiles, DEFAULT_BUILD_FILE_LIMITS } from "./build-files.js";
import { BuildFailure, runBuild } from "./build-run.js";
import { BuildStore, newTemplateId, type StoredTemplate } from "./build-store.js";
import type {
  BuildLogEntry,
  BuildRecipe,
  BuildRecord,
  BuildRequest,
  TemplateBuildService,
  TemplateRecord,
} from "./contract.js";

/** A template's name: an alias without a tag (`team/name` allowed). */
const TEMPLATE_NAME = /^[a-z0-9][a-z0-9._/-]{0,99}$/i;
const TAG = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
export const DEFAULT_TAG = "default";
/** Log entries kept per build (the oldest go first; offsets keep counting). */
const MAX_LOG_ENTRIES = 20_000;
const MAX_LOG_MESSAGE = 8192;
/** Finished builds whose logs stay readable (the SDKs read a build's log to its end once it is done). */
const FINISHED_LOGS_KEPT = 64;
/** Memory a build needs besides its parent VM's RAM (QEMU, the image tools). */
const BUILD_OVERHEAD_MIB = 256;

/** What builds need of the daemon's admission (sandboxes/admission.ts): memory held while a parent VM runs. */
export interface MemoryAdmission {
  /** Throws (unavailable) when the host cannot spare `mib` now. */
  reserveMemory(mib: number, what: string): { release(): void };
}

export interface BuildLimits {
  maxConcurrent: number;
  files: BuildFileLimits;
  defaultMemoryMiB: number;
  defaultCpuCount: number;
  defaultDiskMiB: number;
  maxDiskMiB: number;
  maxMemoryMiB: number;
  maxCpuCount: number;
}

export const DEFAULT_BUILD_LIMITS: Omit<BuildLimits, "files"> = {
  maxConcurrent: 1,
  defaultMemoryMiB: DEFAULT_TEMPLATE_MEMORY_MIB,
  defaultCpuCount: DEFAULT_TEMPLATE_CPU_COUNT,
  defaultDiskMiB: DEFAULT_TEMPLATE_DISK_MIB,
  maxDiskMiB: MAX_TEMPLATE_DISK_MIB,
  maxMemoryMiB: MAX_TEMPLATE_MEMORY_MIB,
  maxCpuCount: MAX_TEMPLATE_CPU_COUNT,
};

/** `name` or `name:tag`. */
export function splitName(value: string): { name: string; tag: string | undefined } {
  const at = value.lastIndexOf(":");
  const name = at < 0 ? value : value.slice(0, at);
  const tag = at < 0 ? undefined : value.slice(at + 1);
  if (!TEMPLATE_NAME.test(name)) {
    throw invalidArgument(
      `template name ${JSON.stringify(name)} must be letters, digits and ._/- (at most 100), starting with a letter or digit`,
    );
  }
  if (tag !== undefined && !TAG.test(tag))
    throw invalidArgument(`tag ${JSON.stringify(tag)} is not a valid tag`);
  return { name, tag };
}

interface Running {
  logs: BuildLogEntry[];
  /** Entries dropped from the front of `logs` (offsets stay those of the whole log). */
  dropped: number;
  abort: AbortController;
}

export class DaemonTemplateBuilds implements TemplateBuildService {
  private readonly running = new Map<string, Running>();
  private readonly finished: string[] = [];
  private active = 0;
  private readonly queue: (() => void)[] = [];
  private closed = false;

  private constructor(
    private readonly store: BuildStore,
    private readonly files: BuildFiles,
    private readonly buildsDir: string,
    private readonly snapshots: DaemonSnapshots,
    private readonly admission: MemoryAdmission,
    private readonly limits: BuildLimits,
  ) {}

  static async open(options: {
    home: string;
    snapshots: DaemonSnapshots;
    admission: MemoryAdmission;
    limits?: Partial<BuildLimits>;
  }): Promise<DaemonTemplateBuilds> {
    const buildsDir = path.join(options.home, "builds");
    const limits: BuildLimits = {
      ...DEFAULT_BUILD_LIMITS,
      files: DEFAULT_BUILD_FILE_LIMITS,
      ...options.limits,
    };
    const store = await BuildStore.open(path.join(buildsDir, "templates"));
    const files = new BuildFiles(path.join(buildsDir, "files"), limits.files);
    return new DaemonTemplateBuilds(store, files, buildsDir, options.snapshots, options.admission, limits);
  }

  /** Cancels running builds (the daemon is stopping); they are recorded as failed. */
  async close(): Promise<void> {
    this.closed = true;
    for (const run of this.running.values()) run.abort.abort(new Error("the daemon is stopping"));
    for (const wake of this.queue.splice(0)) wake();
  }

  // ---- what a caller may see ----

  private visible(stored: StoredTemplate | undefined, owner: string | null | undefined): StoredTemplate {
    if (!stored || (owner !== undefined && owner !== null && stored.template.owner !== owner)) {
      throw notFound("template not found");
    }
    return stored;
  }

  private find(idOrName: string, owner: string | null | undefined): StoredTemplate {
    const byId = this.store.get(idOrName);
    if (byId) return this.visible(byId, owner);
    const { name } = splitName(idOrName);
    return this.visible(this.store.byName(name), owner);
  }

  async recipe(idOrName: string, owner?: string | null): Promise<BuildRecipe> {
    const stored = this.find(idOrName, owner);
    const { tag } = this.store.get(idOrName) ? { tag: undefined } : splitName(idOrName);
    const buildId = tag === undefined ? stored.template.readyBuild : stored.template.tags[tag]?.buildId;
    const recipe = buildId ? stored.recipes[buildId] : undefined;
    if (!recipe) throw notFound(`template ${JSON.stringify(idOrName)} has no ready build`);
    return recipe;
  }

  async get(idOrName: string, owner?: string | null): Promise<TemplateRecord> {
    return this.find(idOrName, owner).template;
  }

  async builds(templateId: string, owner?: string | null): Promise<BuildRecord[]> {
    return this.find(templateId, owner).builds;
  }

  async list(owner?: string | null): Promise<TemplateRecord[]> {
    return this.store
      .all()
      .filter((t) => owner === undefined || owner === null || t.template.owner === owner)
      .map((t) => t.template);
  }

  // ---- requests ----

  /** Refuses a name held by something other than this template (another template, alias or snapshot). */
  private async checkNameFree(name: string, stored: StoredTemplate | undefined): Promise<void> {
    assertAlias(name);
    const alias = (await this.snapshots.aliases.list()).find((a) => a.alias === name);
    const ours = stored?.builds.some((b) => b.snapshot !== null && b.snapshot === alias?.tag) ?? false;
    if (alias && !ours) throw conflict(`the name ${JSON.stringify(name)} is taken`);
    if (!stored && (await this.snapshots.store.exists(name).catch(() => false))) {
      throw conflict(`the name ${JSON.stringify(name)} is taken`);
    }
  }

  async request(request: BuildRequest): Promise<{ template: TemplateRecord; build: BuildRecord }> {
    const { name, tag } = splitName(request.name);
    const tags = [...new Set([...(tag ? [tag] : []), ...request.tags])];
    for (const t of tags)
      if (!TAG.test(t)) throw invalidArgument(`tag ${JSON.stringify(t)} is not a valid tag`);
    const owner = request.owner ?? null;
    const existing = this.store.byName(name);
    if (existing && existing.template.owner !== owner)
      throw conflict(`the name ${JSON.stringify(name)} is taken`);
    await this.checkNameFree(name, existing);
    const cpuCount = request.cpuCount ?? existing?.template.cpuCount ?? this.limits.defaultCpuCount;
    const memoryMiB = request.memoryMiB ?? existing?.template.memoryMiB ?? this.limits.defaultMemoryMiB;
    if (!Number.isInteger(cpuCount) || cpuCount < 1 || cpuCount > this.limits.maxCpuCount) {
      throw invalidArgument(`cpuCount must be 1..${this.limits.maxCpuCount}`);
    }
    if (
      !Number.isInteger(memoryMiB) ||
      memoryMiB < MIN_TEMPLATE_MEMORY_MIB ||
      memoryMiB > this.limits.maxMemoryMiB
    ) {
      throw invalidArgument(`memoryMB must be 128..${this.limits.maxMemoryMiB}`);
    }
    const diskMiB =
      request.minFreeDiskMiB === undefined
        ? (existing?.template.diskMiB ?? this.limits.defaultDiskMiB)
        : Math.max(this.limits.defaultDiskMiB, 2048 + request.minFreeDiskMiB);
    if (!Number.isInteger(diskMiB) || diskMiB > this.limits.maxDiskMiB) {
      throw invalidArgument(`minFreeDiskMb must leave the disk at most ${this.limits.maxDiskMiB} MiB`);
    }
    const now = new Date().toISOString();
    const stored: StoredTemplate = existing ?? {
      template: {
        id: newTemplateId(),
        name,
        owner,
        createdAt: now,
        updatedAt: now,
        cpuCount,
        memoryMiB,
        diskMiB,
        tags: {},
        readyBuild: null,
        buildCount: 0,
      },
      builds: [],
      recipes: {},
    };
    stored.template.cpuCount = cpuCount;
    stored.template.diskMiB = diskMiB;
    stored.template.memoryMiB = memoryMiB;
    stored.template.updatedAt = now;
    const build: BuildRecord = {
      id: randomUUID(),
      templateId: stored.template.id,
      status: "waiting",
      createdAt: now,
      finishedAt: null,
      tags: tags.length > 0 ? tags : [DEFAULT_TAG],
      snapshot: null,
      reason: null,
    };
    stored.builds.push(build);
    await this.store.put(stored);
    return { template: stored.template, build };
  }

  async hasFiles(hash: string, owner?: string | null): Promise<boolean> {
    return this.files.has(hash, owner ?? null);
  }

  async putFiles(hash: string, body: Readable, owner?: string | null): Promise<void> {
    await this.files.put(hash, body, owner ?? null);
  }

  // ---- running a build ----

  async start(
    templateId: string,
    buildId: string,
    recipe: BuildRecipe,
    owner?: string | null,
  ): Promise<void> {
    const stored = this.find(templateId, owner);
    const build = stored.builds.find((b) => b.id === buildId);
    if (!build) throw notFound(`build ${buildId} not found`);
    if (build.status !== "waiting" || this.running.has(buildId)) {
      throw conflict(`build ${buildId} has already been started`);
    }
    for (const copy of recipe.copies) {
      if (!(await this.files.has(copy.files, stored.template.owner))) {
        throw invalidArgument(
          `no files were uploaded under hash ${copy.files} (step ${recipe.stepLabels[copy.step + 1] ?? copy.step})`,
        );
      }
    }
    const run: Running = { logs: [], dropped: 0, abort: new AbortController() };
    this.running.set(buildId, run);
    this.log(run, {
      level: "info",
      message: `Build ${buildId} of template ${stored.template.name} accepted`,
    });
    void this.execute(stored, build, recipe, run);
  }

  private log(run: Running, entry: Omit<BuildLogEntry, "timestamp">): void {
    const message =
      entry.message.length > MAX_LOG_MESSAGE
        ? `${entry.message.slice(0, MAX_LOG_MESSAGE)}...`
        : entry.message;
    run.logs.push({ timestamp: new Date().toISOString(), ...entry, message });
    if (run.logs.length > MAX_LOG_ENTRIES) {
      run.logs.shift();
      run.dropped++;
    }
  }

  /** Waits for a build slot (the build stays "waiting" until then). */
  private async slot(run: Running): Promise<void> {
    while (this.active >= this.limits.maxConcurrent) {
      this.log(run, {
        level: "info",
        message: `waiting: ${this.active} build(s) running (limit ${this.limits.maxConcurrent})`,
      });
      await new Promise<void>((resolve) => this.queue.push(resolve));
      if (this.closed || run.abort.signal.aborted)
        throw new ForkdError("unavailable", "the build was cancelled");
    }
    this.active++;
  }

  private release(): void {
    this.active--;
    this.queue.shift()?.();
  }

  private async execute(
    stored: StoredTemplate,
    build: BuildRecord,
    recipe: BuildRecipe,
    run: Running,
  ): Promise<void> {
    const template = stored.template;
    let slotted = false;
    try {
      await this.slot(run);
      slotted = true;
      const memory = this.admission.reserveMemory(
        template.memoryMiB + BUILD_OVERHEAD_MIB,
        "a template build",
      );
      try {
        build.status = "building";
        await this.store.save(template.id);
        template.buildCount++;
        const tag = `tpl-${template.id}-${template.buildCount}`;
        await runBuild({
          buildId: build.id,
          tag,
          owner: template.owner,
          recipe: withMachine(recipe, template),
          buildsDir: this.buildsDir,
          files: this.files,
          snapshots: this.snapshots,
          log: (entry) => this.log(run, entry),
          signal: run.abort.signal,
        });
        build.snapshot = tag;
        stored.recipes[build.id] = recipe;
        await this.publish(stored, build);
        build.status = "ready";
        this.log(run, {
          level: "info",
          message: `Build finished: snapshot ${tag}, template ${template.name} ready`,
        });
      } finally {
        memory.release();
      }
    } catch (err) {
      build.status = "error";
      const step = err instanceof BuildFailure ? err.step : undefined;
      const message = err instanceof Error ? err.message : String(err);
      build.reason = { message, ...(step === undefined ? {} : { step }) };
      this.log(run, { level: "error", message, ...(step === undefined ? {} : { step }) });
    } finally {
      if (slotted) this.release();
      this.finished.push(build.id);
      if (this.finished.length > FINISHED_LOGS_KEPT) this.running.delete(this.finished.shift() as string);
      build.finishedAt = new Date().toISOString();
      await this.store.save(template.id).catch(() => {});
    }
  }

  /** Points the template's names at the build's snapshot and retires the snapshot they named before. */
  private async publish(stored: StoredTemplate, build: BuildRecord): Promise<void> {
    const template = stored.template;
    const tag = build.snapshot as string;
    const previous =
      template.readyBuild === null ? null : stored.builds.find((b) => b.id === template.readyBuild);
    const now = new Date().toISOString();
    await this.snapshots.aliases.set(template.name, tag, template.owner);
    await this.snapshots.aliases.set(template.id, tag, template.owner);
    for (const t of build.tags) {
      await this.snapshots.aliases.set(`${template.name}:${t}`, tag, template.owner);
      template.tags[t] = { buildId: build.id, assignedAt: now };
    }
    template.readyBuild = build.id;
    template.updatedAt = now;
    await this.retireUnnamed(stored, previous?.snapshot ?? null);
  }

  /** Retires `snapshot` (an earlier build's) once no name of the template points at it. */
  private async retireUnnamed(stored: StoredTemplate, snapshot: string | null): Promise<void> {
    if (snapshot === null) return;
    const named = (await this.snapshots.aliases.list()).some((a) => a.tag === snapshot);
    const stillReady =
      stored.template.readyBuild !== null &&
      stored.builds.find((b) => b.id === stored.template.readyBuild)?.snapshot === snapshot;
    if (!named && !stillReady) await this.snapshots.retire(snapshot).catch(() => {});
  }

  async status(
    templateId: string,
    buildId: string,
    options: { logsOffset?: number; limit?: number; owner?: string | null } = {},
  ): Promise<{ template: TemplateRecord; build: BuildRecord; logs: BuildLogEntry[] }> {
    const stored = this.find(templateId, options.owner);
    const build = stored.builds.find((b) => b.id === buildId);
    if (!build) throw notFound(`build ${buildId} not found`);
    const run = this.running.get(buildId);
    const offset = Math.max(0, options.logsOffset ?? 0);
    const limit = Math.min(Math.max(1, options.limit ?? 100), 1000);
    const logs = run
      ? run.logs.slice(Math.max(0, offset - run.dropped), Math.max(0, offset - run.dropped) + limit)
      : [];
    return { template: stored.template, build, logs };
  }

  // ---- tags and deletion ----

  async assignTags(
    target: string,
    tags: string[],
    owner?: string | null,
  ): Promise<{ buildId: string; tags: string[] }> {
    const { name, tag } = splitName(target);
    const stored = this.find(name, owner);
    const template = stored.template;
    const buildId = tag === undefined ? template.readyBuild : template.tags[tag]?.buildId;
    const build = stored.builds.find((b) => b.id === buildId && b.status === "ready" && b.snapshot !== null);
    if (!build) throw notFound(`template ${JSON.stringify(target)} has no ready build`);
    for (const t of tags)
      if (!TAG.test(t)) throw invalidArgument(`tag ${JSON.stringify(t)} is not a valid tag`);
    const now = new Date().toISOString();
    for (const t of tags) {
      const before = template.tags[t]?.buildId;
      await this.snapshots.aliases.set(`${template.name}:${t}`, build.snapshot as string, template.owner);
      template.tags[t] = { buildId: build.id, assignedAt: now };
      const old = stored.builds.find((b) => b.id === before && b.id !== build.id);
      await this.retireUnnamed(stored, old?.snapshot ?? null);
    }
    await this.store.save(template.id);
    return { buildId: build.id, tags };
  }

  async removeTags(nameOrId: string, tags: string[], owner?: string | null): Promise<void> {
    const stored = this.find(nameOrId, owner);
    const template = stored.template;
    for (const t of tags) {
      const entry = template.tags[t];
      if (!entry) throw notFound(`template ${template.name} has no tag ${JSON.stringify(t)}`);
      this.snapshots.aliases.delete(`${template.name}:${t}`);
      delete template.tags[t];
      await this.retireUnnamed(stored, stored.builds.find((b) => b.id === entry.buildId)?.snapshot ?? null);
    }
    await this.store.save(template.id);
  }

  async delete(idOrName: string, owner?: string | null): Promise<void> {
    const stored = this.find(idOrName, owner);
    for (const build of stored.builds)
      this.running.get(build.id)?.abort.abort(new Error("the template was deleted"));
    const snapshots = new Set(stored.builds.map((b) => b.snapshot).filter((t): t is string => t !== null));
    for (const alias of await this.snapshots.aliases.list()) {
      if (snapshots.has(alias.tag)) this.snapshots.aliases.delete(alias.alias);
    }
    for (const tag of snapshots) await this.snapshots.retire(tag).catch(() => {});
    await this.store.remove(stored.template.id);
  }
}

/** The recipe with the template's machine (vCPUs, RAM) as its format-2 fields. */
function withMachine(recipe: BuildRecipe, template: TemplateRecord): BuildRecipe {
  return {
    ...recipe,
    template: {
      ...recipe.template,
      vcpus: template.cpuCount,
      memory_mib: template.memoryMiB,
      disk_mib: template.diskMiB,
    },
  };
}
