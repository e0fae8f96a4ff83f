/** The daemon's template and build records as E2B's wire shapes (schemas.ts). */
import type { Static } from "@sinclair/typebox";
import { ForkdError } from "../../common/errors.js";
import type {
  BuildLogEntry,
  BuildRecord,
  TemplateBuildService,
  TemplateRecord,
} from "../../controller/builds/contract.js";
import type { Services } from "../../controller/tenancy/tenant-view.js";
import { ENVD_VERSION } from "../envd/version.js";
import type { LogEntry, TemplateWithBuilds } from "./schemas.js";

/** The caller's template builds, or 501 where the daemon composes none. */
export function buildsOf(services: Services): TemplateBuildService {
  if (!services.builds)
    throw new ForkdError("not_implemented", "template builds are not available on this listener");
  return services.builds;
}

/** The template's names: its name, its id and `name:tag` for each tag (all aliases of its newest ready build). */
export function namesOf(template: TemplateRecord): string[] {
  return [template.name, ...Object.keys(template.tags).map((t) => `${template.name}:${t}`)];
}

export function logToWire(entry: BuildLogEntry): Static<typeof LogEntry> {
  return {
    timestamp: entry.timestamp,
    message: entry.message,
    level: entry.level,
    ...(entry.step === undefined ? {} : { step: entry.step }),
  };
}

export function templateToWire(
  template: TemplateRecord,
  builds: BuildRecord[],
): Static<typeof TemplateWithBuilds> {
  const newest = builds.at(-1);
  return {
    templateID: template.id,
    buildID: template.readyBuild ?? newest?.id ?? "",
    cpuCount: template.cpuCount,
    memoryMB: template.memoryMiB,
    diskSizeMB: template.diskMiB,
    public: false,
    aliases: [template.name],
    names: namesOf(template),
    createdAt: template.createdAt,
    updatedAt: template.updatedAt,
    createdBy: null,
    lastSpawnedAt: null,
    spawnCount: 0,
    buildCount: template.buildCount,
    envdVersion: ENVD_VERSION,
    buildStatus: template.readyBuild ? "ready" : (newest?.status ?? "waiting"),
    builds: builds.map((b) => ({
      buildID: b.id,
      status: b.status,
      createdAt: b.createdAt,
      updatedAt: b.finishedAt ?? b.createdAt,
      ...(b.finishedAt ? { finishedAt: b.finishedAt } : {}),
      cpuCount: template.cpuCount,
      memoryMB: template.memoryMiB,
      diskSizeMB: template.diskMiB,
      envdVersion: ENVD_VERSION,
    })),
  };
}
