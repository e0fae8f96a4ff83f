/**
 * Pieces shared by both template formats: how a field is named in an error, how a value is shown, and how a
 * host path written in a template is resolved (relative to the template file, never outside its directory).
 */
import fs from "node:fs/promises";
import path from "node:path";
import { Type } from "@sinclair/typebox";

export function intInRange(min: number, max: number) {
  return Type.Integer({ minimum: min, maximum: max, rule: `must be a whole number from ${min} to ${max}` });
}

/** "/files/0/src" -> "files[0].src" */
export function fieldName(pointer: string): string {
  return pointer
    .split("/")
    .filter((p) => p !== "")
    .map((p, i) => (/^\d+$/.test(p) ? `[${p}]` : i === 0 ? p : `.${p}`))
    .join("");
}

export function describeValue(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

export function isInside(parent: string, child: string): boolean {
  const rel = path.relative(parent, child);
  return rel !== "" && !rel.startsWith("..") && !path.isAbsolute(rel);
}

export type HostPathKind = "file" | "directory" | "file or directory";

/**
 * `relative` (as written in the template) resolved against the template's directory: refused when absolute,
 * starting with `~`, containing a `..` segment, missing, of the wrong kind, or resolving (through symlinks)
 * outside the template's directory. `"."` names the directory itself (allowed for directories only).
 * Returns the real path, or pushes a problem naming `field` and returns undefined.
 */
export async function resolveTemplatePath(
  templateFile: string,
  field: string,
  relative: string,
  kind: HostPathKind,
  problems: string[],
): Promise<string | undefined> {
  const templateDir = path.dirname(templateFile);
  const say = (rule: string) => {
    problems.push(`${templateFile}: field "${field}" ${rule}`);
    return undefined;
  };
  if (path.isAbsolute(relative) || relative.startsWith("~")) {
    return say(`must be relative to the template file (got ${describeValue(relative)})`);
  }
  if (relative.split(/[\\/]/).includes(".."))
    return say(`must not contain ".." (got ${describeValue(relative)})`);
  if (relative.includes("\0")) return say("must not contain NUL");
  const realTemplateDir = await fs.realpath(templateDir);
  const full = path.resolve(templateDir, relative);
  let real: string;
  try {
    real = await fs.realpath(full);
  } catch {
    return say(`names a ${kind} that does not exist: ${full}`);
  }
  const isDirItself = real === realTemplateDir;
  if (!isDirItself && !isInside(realTemplateDir, real)) {
    return say(`resolves outside the template's directory (${real})`);
  }
  const st = await fs.stat(real);
  const ok =
    kind === "file" ? st.isFile() : kind === "directory" ? st.isDirectory() : st.isFile() || st.isDirectory();
  if (!ok) return say(`must be a ${kind === "file" ? "regular file" : kind}: ${full}`);
  if (isDirItself && kind === "file") return say(`must be a regular file: ${full}`);
  return real;
}

/** A guest path as templates must write it: absolute and normalized, no trailing '/', no NUL. */
export function isNormalizedGuestPath(p: string): boolean {
  return (
    p.startsWith("/") && path.posix.normalize(p) === p && (p === "/" || !p.endsWith("/")) && !p.includes("\0")
  );
}

/** Environment variable names a template may set (POSIX portable names). */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
