/**
 * Validation of every user-supplied name that becomes part of a path. A name that passes here is a single
 * path component: no separators, never "." or "..", no leading dot or dash.
 */
import { invalidArgument } from "./errors.js";
import { SANDBOX_ID_PATTERN, SANDBOX_REF_PATTERN, TAG_PATTERN } from "./limits.js";

const TAG = new RegExp(TAG_PATTERN);
const SANDBOX_ID = new RegExp(SANDBOX_ID_PATTERN);
/** A name a caller may ask about: a single safe path component (our ids, and forkd v0.5's sb-<hex>-<hex>). */
const SANDBOX_REF = new RegExp(SANDBOX_REF_PATTERN);

/** An anchored pattern of limits.ts without its anchors, to embed in a larger expression. */
export function unanchored(pattern: string): string {
  if (!pattern.startsWith("^") || !pattern.endsWith("$")) throw new Error(`${pattern} is not anchored`);
  return pattern.slice(1, -1);
}

/**
 * An image reference as registries spell it: [host[:port]/]path[:tag][@sha256:digest]. Lowercase path
 * components, never starting with '-' (it becomes a command-line argument of skopeo).
 */
export const IMAGE_REFERENCE =
  /^(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*(?::[0-9]{1,5})?\/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$/;

export function isValidTag(tag: unknown): tag is string {
  return typeof tag === "string" && TAG.test(tag);
}

/** Throws `invalid_argument` naming the rule unless `tag` is a safe snapshot tag. */
export function assertTag(tag: unknown, what = "tag"): string {
  if (!isValidTag(tag)) {
    throw invalidArgument(
      `invalid ${what} ${JSON.stringify(tag)}: must match ${unanchored(TAG_PATTERN)} (no '/' and no leading '.')`,
    );
  }
  return tag;
}

/** Template names follow the same rule as tags: they name files and cache directories. */
export const assertTemplateName = (name: unknown) => assertTag(name, "template name");

export function isValidSandboxId(id: unknown): id is string {
  return typeof id === "string" && SANDBOX_ID.test(id);
}

export function assertSandboxId(id: unknown): string {
  if (!isValidSandboxId(id))
    throw invalidArgument(`invalid sandbox id ${JSON.stringify(id)}: expected sb-<12 hex>`);
  return id;
}

/**
 * Throws `invalid_argument` unless `id` could name a sandbox without being a path. An id of another shape than
 * ours (e.g. forkd v0.5's) passes: it is simply unknown here.
 */
export function assertSandboxRef(id: unknown): string {
  if (typeof id !== "string" || !SANDBOX_REF.test(id)) {
    throw invalidArgument(
      `invalid sandbox id ${JSON.stringify(id)}: expected sb-<12 hex> (letters, digits, '.', '_', '-'; no '/')`,
    );
  }
  return id;
}
