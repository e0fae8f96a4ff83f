/**
 * The records of templates and their builds, one JSON file per template (`<dir>/<templateId>.json`), replaced
 * whole by write-then-rename so a crash leaves the old record or the new one. Logs are not kept here (the
 * service holds them while the daemon runs). A build still waiting or building when the daemon starts belongs to
 * a daemon that is gone: `open` marks it failed.
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import type { BuildRecipe, BuildRecord, TemplateRecord } from "./contract.js";

/** Builds kept per template (the oldest finished ones are forgotten first). */
const MAX_BUILDS = 64;
const TEMPLATE_ID = /^[a-z0-9]{20}$/;

export interface StoredTemplate {
  template: TemplateRecord;
  builds: BuildRecord[];
  /** The recipes of ready builds (a later build may start from one: E2B's fromTemplate). */
  recipes: Record<string, BuildRecipe>;
}

export function newTemplateId(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  return [...randomBytes(20)].map((b) => alphabet[b % alphabet.length]).join("");
}

export function isTemplateId(value: string): boolean {
  return TEMPLATE_ID.test(value);
}

export class BuildStore {
  private readonly templates = new Map<string, StoredTemplate>();

  private constructor(private readonly dir: string) {}

  static async open(dir: string): Promise<BuildStore> {
    await fs.mkdir(dir, { recursive: true, mode: 0o700 });
    const store = new BuildStore(dir);
    for (const name of await fs.readdir(dir)) {
      const id = name.replace(/\.json$/, "");
      if (!name.endsWith(".json") || !isTemplateId(id)) continue;
      const text = await fs.readFile(path.join(dir, name), "utf8").catch(() => undefined);
      if (text === undefined) continue;
      const stored = JSON.parse(text) as StoredTemplate;
      stored.recipes ??= {};
      let changed = false;
      for (const build of stored.builds) {
        if (build.status === "waiting" || build.status === "building") {
          build.status = "error";
          build.finishedAt = new Date().toISOString();
          build.reason = { message: "the daemon stopped while the build was running" };
          changed = true;
        }
      }
      store.templates.set(id, stored);
      if (changed) await store.save(id);
    }
    return store;
  }

  all(): StoredTemplate[] {
    return [...this.templates.values()];
  }

  get(id: string): StoredTemplate | undefined {
    return this.templates.get(id);
  }

  byName(name: string): StoredTemplate | undefined {
    return this.all().find((t) => t.template.name === name);
  }

  async put(stored: StoredTemplate): Promise<void> {
    this.templates.set(stored.template.id, stored);
    await this.save(stored.template.id);
  }

  async remove(id: string): Promise<void> {
    this.templates.delete(id);
    await fs.rm(path.join(this.dir, `${id}.json`), { force: true });
  }

  /** Writes the template's record (bounding its builds) by write-then-rename. */
  async save(id: string): Promise<void> {
    const stored = this.templates.get(id);
    if (!stored) return;
    if (stored.builds.length > MAX_BUILDS) {
      const keep = new Set([
        stored.template.readyBuild,
        ...Object.values(stored.template.tags).map((t) => t.buildId),
      ]);
      const removable = stored.builds.filter((b) => !keep.has(b.id) && b.finishedAt !== null);
      const drop = new Set(removable.slice(0, stored.builds.length - MAX_BUILDS).map((b) => b.id));
      stored.builds = stored.builds.filter((b) => !drop.has(b.id));
      for (const id of drop) delete stored.recipes[id];
    }
    const file = path.join(this.dir, `${id}.json`);
    const temp = `${file}.${randomBytes(4).toString("hex")}.tmp`;
    await fs.writeFile(temp, JSON.stringify(stored), { mode: 0o600 });
    await fs.rename(temp, file);
  }
}
