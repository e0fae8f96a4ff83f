/**
 * The build-step cache of format-2 templates: one entry per step key (the hash of everything up to and
 * including that step, see step-plan.ts), each a complete OCI layout of the image after the step plus the
 * image's settings (env, working directory, user) at that point:
 *
 *   <images>/.steps/<key>/{layout/, step.json}
 *
 * A step's layout is its parent's with hard-linked blobs (content-addressed, never written in place) and at
 * most one new layer, so an entry costs the size of what its step changed. Entries are written in the build's
 * staging directory and renamed into place when complete, like images: a reader sees a whole entry or none,
 * and a build that dies leaves nothing here (its staging directory is swept). Removing `.steps` while no build
 * runs only costs rebuild time.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { type Static, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { fsyncPath } from "../common/durable-fs.js";
import { ForkdError } from "../common/errors.js";
import type { ImageSettings } from "./oci-layout.js";
import { RECIPE_HASH_PATTERN } from "./recipe.js";

export const STEPS_DIR = ".steps";
const STEP_RECORD = "step.json";
export const STEP_LAYOUT = "layout";

const StepRecordSchema = Type.Object({
  key: Type.String({ pattern: RECIPE_HASH_PATTERN.source }),
  parent: Type.Union([Type.String({ pattern: RECIPE_HASH_PATTERN.source }), Type.Null()]),
  description: Type.String({ maxLength: 2000 }),
  settings: Type.Object({
    env: Type.Array(Type.String(), { maxItems: 4096 }),
    workdir: Type.String(),
    user: Type.String(),
  }),
  seconds: Type.Number(),
  builtAt: Type.String(),
});
export type StepRecord = Static<typeof StepRecordSchema>;

export interface StepEntry {
  dir: string;
  layout: string;
  record: StepRecord;
}

export function stepEntryDir(cacheDir: string, key: string): string {
  if (!RECIPE_HASH_PATTERN.test(key)) throw new ForkdError("internal", `bad step key ${key}`);
  return path.join(cacheDir, STEPS_DIR, key);
}

/** The cached entry for `key`, or undefined when there is none (or it is not whole). */
export async function readStepEntry(cacheDir: string, key: string): Promise<StepEntry | undefined> {
  const dir = stepEntryDir(cacheDir, key);
  try {
    const record: unknown = JSON.parse(await fs.readFile(path.join(dir, STEP_RECORD), "utf8"));
    if (!Value.Check(StepRecordSchema, record) || record.key !== key) return undefined;
    const layout = path.join(dir, STEP_LAYOUT);
    if (!(await fs.stat(path.join(layout, "index.json"))).isFile()) return undefined;
    return { dir, layout, record };
  } catch {
    return undefined;
  }
}

/** An entry being written inside a build's staging directory. */
export interface PendingStep {
  dir: string;
  layout: string;
}

export async function beginStep(stagingWork: string, key: string): Promise<PendingStep> {
  const dir = path.join(stagingWork, "steps", key);
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  return { dir, layout: path.join(dir, STEP_LAYOUT) };
}

/**
 * Writes the entry's record and renames it into the cache. When another build published the same key first,
 * that entry stays (both were made from the same inputs) and ours is left to the staging directory's removal;
 * with `replace` (a forced build) ours takes its place.
 */
export async function publishStep(
  cacheDir: string,
  pending: PendingStep,
  record: {
    key: string;
    parent: string | null;
    description: string;
    settings: ImageSettings;
    seconds: number;
  },
  replace = false,
): Promise<StepEntry> {
  const full: StepRecord = { ...record, builtAt: new Date().toISOString() };
  await fs.writeFile(path.join(pending.dir, STEP_RECORD), `${JSON.stringify(full, null, 2)}\n`, {
    mode: 0o600,
  });
  await fsyncPath(path.join(pending.dir, STEP_RECORD));
  await fsyncPath(pending.dir);
  const target = stepEntryDir(cacheDir, record.key);
  await fs.mkdir(path.dirname(target), { recursive: true, mode: 0o700 });
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      await fs.rename(pending.dir, target);
      await fsyncPath(path.dirname(target));
      break;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== "ENOTEMPTY" && code !== "EEXIST") throw err;
      if (!replace && (await readStepEntry(cacheDir, record.key))) break;
      // A replaced (forced build) or broken entry: moved beside ours, to go with the staging directory. A build
      // that already unpacked it is not disturbed: its tree is its own copy.
      await fs.rename(target, `${pending.dir}.broken`).catch(() => {});
    }
  }
  const entry = await readStepEntry(cacheDir, record.key);
  if (!entry) throw new ForkdError("internal", `step entry ${record.key} is incomplete after publishing`);
  return entry;
}
