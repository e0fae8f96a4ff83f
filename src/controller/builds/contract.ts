/**
 * Template builds as every face sees them (the E2B template API today): a named template of a tenant, its
 * builds, each a format-2 template (docs/templates.md) built from files the caller uploaded, booted and
 * snapshotted; the newest ready build is what the template's names resolve to. A leaf: types only.
 */
import type { Readable } from "node:stream";

export type BuildStatus = "waiting" | "building" | "ready" | "error";
export type LogLevel = "debug" | "info" | "warn" | "error";

export interface BuildLogEntry {
  timestamp: string;
  level: LogLevel;
  message: string;
  /** The step it belongs to, in the caller's numbering (BuildRecipe.stepLabels). */
  step?: string;
}

export interface TemplateRecord {
  id: string;
  /** The template's name (an alias of its newest ready build), without a tag. */
  name: string;
  /** The tenant it belongs to; null: an admin's. */
  owner: string | null;
  createdAt: string;
  updatedAt: string;
  cpuCount: number;
  memoryMiB: number;
  /** Size of the image's disk. */
  diskMiB: number;
  /** Tags (`name:tag` aliases) and the build each names. */
  tags: Record<string, { buildId: string; assignedAt: string }>;
  /** The newest ready build, whose snapshot the template's names resolve to. */
  readyBuild: string | null;
  buildCount: number;
}

export interface BuildRecord {
  id: string;
  templateId: string;
  status: BuildStatus;
  createdAt: string;
  finishedAt: string | null;
  /** Tags the build gets when it is ready. */
  tags: string[];
  /** The snapshot it made (once ready). */
  snapshot: string | null;
  /** Why it failed: the message, and the step (caller's numbering) when one step failed. */
  reason: { message: string; step?: string } | null;
}

/** An uploaded archive a copy step takes its files from. */
export interface RecipeCopy {
  /** Index into `template.steps` of the copy step. */
  step: number;
  /** The archive's name: the hash the caller uploaded it under. */
  files: string;
  /** What to copy out of the archive: a relative path inside it ("" or "." for all of it). */
  source: string;
  /** A file source goes into `dest` (dest/<name>) rather than to it. */
  into: boolean;
}

export interface BuildRecipe {
  /**
   * A format-2 template as its TOML document would say it (docs/templates.md), without host paths: its copy
   * steps name no source (the service fills in where it unpacked `copies`).
   */
  template: Record<string, unknown>;
  copies: RecipeCopy[];
  /** How the caller numbers steps: label of the base (index 0) and of each step; `finish` for boot/start/ready. */
  stepLabels: string[];
  finishLabel: string;
  /** Build every step again (no cached step, the base fetched again). */
  force: boolean;
}

export interface BuildRequest {
  name: string;
  tags: string[];
  cpuCount?: number;
  memoryMiB?: number;
  /** Free disk space the template's sandboxes should have (the image's disk is sized for it). */
  minFreeDiskMiB?: number;
  owner?: string | null;
}

export interface TemplateBuildService {
  /** A new build of the caller's template `name` (made if it is new), waiting for its recipe. */
  request(request: BuildRequest): Promise<{ template: TemplateRecord; build: BuildRecord }>;
  /** Whether the caller already uploaded the archive `hash`. */
  hasFiles(hash: string, owner?: string | null): Promise<boolean>;
  /** Stores an archive (a tar, optionally gzip'd) under `hash`: size-bounded, every entry checked. */
  putFiles(hash: string, body: Readable, owner?: string | null): Promise<void>;
  /** Starts a waiting build; it runs in the background (status() follows it). */
  start(templateId: string, buildId: string, recipe: BuildRecipe, owner?: string | null): Promise<void>;
  /** A build and its log from entry `logsOffset` on (at most `limit`). */
  status(
    templateId: string,
    buildId: string,
    options?: { logsOffset?: number; limit?: number; owner?: string | null },
  ): Promise<{ template: TemplateRecord; build: BuildRecord; logs: BuildLogEntry[] }>;
  /** The recipe of the build a template name (`name`, `name:tag`, or its id) resolves to: a base for another. */
  recipe(idOrName: string, owner?: string | null): Promise<BuildRecipe>;
  /** A template by id, or by name (with an optional `:tag`). */
  get(idOrName: string, owner?: string | null): Promise<TemplateRecord>;
  builds(templateId: string, owner?: string | null): Promise<BuildRecord[]>;
  list(owner?: string | null): Promise<TemplateRecord[]>;
  /** Points `tags` of template `name` at the build `name:tag` (or its newest ready build) names. */
  assignTags(
    target: string,
    tags: string[],
    owner?: string | null,
  ): Promise<{ buildId: string; tags: string[] }>;
  removeTags(name: string, tags: string[], owner?: string | null): Promise<void>;
  /** Deletes the template: running builds are cancelled, its names go, its snapshots once unused. */
  delete(idOrName: string, owner?: string | null): Promise<void>;
}
