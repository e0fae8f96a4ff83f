/**
 * Templates: TOML files that say what goes into a guest image and how big its VMs are. Parsed with smol-toml,
 * checked with typebox, then checked for the rules a schema cannot express (warm-up only with Python, extra
 * files that stay inside the template's directory). Every error names the file, the field and the rule.
 *
 * Two formats: 1 (no `format` field: Debian packages, files, warm-up) and 2 (`format = 2`: also `from` an OCI
 * image, archive, registry or Dockerfile, build steps, start and ready commands; see template-v2.ts).
 */
import fs from "node:fs/promises";
import path from "node:path";
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { parse as parseToml } from "smol-toml";
import { ForkdError, invalidArgument } from "../common/errors.js";
import { TAG_PATTERN } from "../common/limits.js";
import { assertTemplateName, isValidTag, unanchored } from "../common/names.js";
import { builtinTemplatesDir } from "./package-root.js";
import { describeValue, fieldName, intInRange, isInside } from "./template-fields.js";
import {
  CommandSchema,
  checkV2,
  DockerfileSchema,
  FromSchema,
  type ImageSource,
  type ReadyCheck,
  StepSchema,
  type TemplateCommand,
  type TemplateStep,
  V2_LIMITS,
  type V2Document,
} from "./template-v2.js";

export type { ImageSource, ReadyCheck, StepKind, TemplateCommand, TemplateStep } from "./template-v2.js";

export type Interpreter = "python" | "none";

export interface TemplateFile {
  /** Absolute host path of the file to copy. */
  src: string;
  /** `src` as written in the template (relative to the template file). */
  srcRelative: string;
  /** Absolute path inside the guest. */
  dest: string;
  mode: number;
}

export interface Template {
  name: string;
  description: string;
  /** Debian packages installed on top of minbase (python3 is added for interpreter "python"). */
  packages: string[];
  memoryMib: number;
  vcpus: number;
  diskMib: number;
  interpreter: Interpreter;
  /** Python run once in the parent VM before it is snapshotted; only with interpreter "python". */
  warmup: string | undefined;
  files: TemplateFile[];
  /** 1 (Debian packages only) or 2 (any base, build steps, start/ready). */
  format: 1 | 2;
  /** Where the root filesystem comes from: the host's Debian suite for format 1. */
  base: ImageSource;
  /** Applied on top of the base, in order (format 2). */
  steps: TemplateStep[];
  /** Started in the parent before the snapshot and kept running in every child (format 2). */
  start: TemplateCommand | undefined;
  /** Polled until it exits 0 before the warm-up and snapshot (format 2). */
  ready: ReadyCheck | undefined;
  /**
   * "nic" (default): the parent boots with a virtio-net NIC and its children get a network of their own;
   * "none": no NIC at all (no child of it can ever have network). Not part of the image: a machine setting.
   */
  network: "nic" | "none";
  /**
   * The egress policy a sandbox of this template gets when its spawn names none (`[egress]`); undefined: the
   * daemon's default. Checked here for shape only: the controller checks the entries (src/net/policy.ts) before
   * anything is built. Not part of the image either.
   */
  egress: TemplateEgress | undefined;
  /** Absolute path of the TOML file. */
  source: string;
  builtin: boolean;
}

/** `[egress]`: the same fields as a spawn's egress policy (docs/network.md), `default` required. */
export interface TemplateEgress {
  default: "allow" | "deny";
  allowOut: string[];
  denyOut: string[];
}

export const TEMPLATE_DEFAULTS = {
  format: 1 as 1 | 2,
  description: "",
  memory_mib: 512,
  vcpus: 1,
  disk_mib: 1024,
  interpreter: "python" as Interpreter,
};

export const TEMPLATE_LIMITS = {
  memoryMib: { min: 128, max: 65_536 },
  vcpus: { min: 1, max: 64 },
  diskMib: { min: 256, max: 262_144 },
  packages: 256,
  files: 256,
  warmupBytes: 64 * 1024,
  descriptionChars: 500,
  templateFileBytes: 1024 * 1024,
  /** Per list, as many as a spawn's policy may hold (src/net/policy.ts MAX_POLICY_ENTRIES). */
  egressEntries: 512,
};

/** Debian Policy 5.6.1: lowercase letters, digits, + - . ; at least two characters; starts alphanumeric. */
const DEBIAN_PACKAGE_PATTERN = "^[a-z0-9][a-z0-9+.-]+$";
/** Paths a booting guest mounts over (or owns): a file placed there would be hidden or clobbered. */
const RESERVED_GUEST_DIRS = ["/opt/forkd", "/proc", "/sys", "/dev", "/run", "/tmp"];

const TAG_RULE = `must match ${unanchored(TAG_PATTERN)} (no '/' and no leading '.')`;

const TemplateFileSchema = Type.Object(
  {
    src: Type.String({ minLength: 1, maxLength: 1024, rule: "must be a path relative to the template file" }),
    dest: Type.String({ minLength: 1, maxLength: 1024, rule: "must be an absolute path inside the guest" }),
    mode: Type.Optional(
      Type.Union([Type.Integer({ minimum: 0, maximum: 0o7777 }), Type.String({ pattern: "^[0-7]{3,4}$" })], {
        rule: 'must be an octal permission like "0644" (or the TOML integer 0o644)',
      }),
    ),
  },
  { additionalProperties: false, rule: "must be a table with src, dest and optional mode" },
);

const EgressEntries = Type.Array(Type.String({ minLength: 1, maxLength: 253 }), {
  maxItems: TEMPLATE_LIMITS.egressEntries,
  rule: `must be a list of at most ${TEMPLATE_LIMITS.egressEntries} IPv4 addresses, CIDR blocks or domain names`,
});

const EgressSchema = Type.Object(
  {
    default: Type.Union([Type.Literal("allow"), Type.Literal("deny")], {
      rule: 'must be "allow" or "deny" (what happens to a destination no entry names)',
    }),
    allow_out: Type.Optional(EgressEntries),
    deny_out: Type.Optional(EgressEntries),
  },
  { additionalProperties: false, rule: "must be a table with default and optional allow_out, deny_out" },
);

const TemplateSchema = Type.Object(
  {
    name: Type.String({ pattern: TAG_PATTERN, rule: TAG_RULE }),
    description: Type.Optional(
      Type.String({
        maxLength: TEMPLATE_LIMITS.descriptionChars,
        rule: `must be a string of at most ${TEMPLATE_LIMITS.descriptionChars} characters`,
      }),
    ),
    packages: Type.Optional(
      Type.Array(
        Type.String({
          pattern: DEBIAN_PACKAGE_PATTERN,
          rule: "must be a Debian package name (lowercase letters, digits, '+', '-', '.'; at least 2 characters, starting with a letter or digit)",
        }),
        {
          maxItems: TEMPLATE_LIMITS.packages,
          rule: `must be a list of at most ${TEMPLATE_LIMITS.packages} package names`,
        },
      ),
    ),
    memory_mib: Type.Optional(intInRange(TEMPLATE_LIMITS.memoryMib.min, TEMPLATE_LIMITS.memoryMib.max)),
    vcpus: Type.Optional(intInRange(TEMPLATE_LIMITS.vcpus.min, TEMPLATE_LIMITS.vcpus.max)),
    disk_mib: Type.Optional(intInRange(TEMPLATE_LIMITS.diskMib.min, TEMPLATE_LIMITS.diskMib.max)),
    interpreter: Type.Optional(
      Type.Union([Type.Literal("python"), Type.Literal("none")], { rule: 'must be "python" or "none"' }),
    ),
    warmup: Type.Optional(
      Type.String({
        maxLength: TEMPLATE_LIMITS.warmupBytes,
        rule: `must be a string of Python code of at most ${TEMPLATE_LIMITS.warmupBytes} characters`,
      }),
    ),
    network: Type.Optional(
      Type.Union([Type.Literal("nic"), Type.Literal("none")], {
        rule: 'must be "nic" (a NIC, network per sandbox) or "none" (no NIC)',
      }),
    ),
    egress: Type.Optional(EgressSchema),
    files: Type.Optional(
      Type.Array(TemplateFileSchema, {
        maxItems: TEMPLATE_LIMITS.files,
        rule: `must be a list ([[files]] tables) of at most ${TEMPLATE_LIMITS.files} entries`,
      }),
    ),
    format: Type.Optional(
      Type.Union([Type.Literal(1), Type.Literal(2)], { rule: "must be 1 or 2 (the template format)" }),
    ),
    from: Type.Optional(FromSchema),
    dockerfile: Type.Optional(DockerfileSchema),
    steps: Type.Optional(
      Type.Array(StepSchema, {
        maxItems: V2_LIMITS.steps,
        rule: `must be a list ([[steps]] tables) of at most ${V2_LIMITS.steps} steps`,
      }),
    ),
    start: Type.Optional(CommandSchema),
    ready: Type.Optional(CommandSchema),
  },
  { additionalProperties: false },
);

/** Fields only format 2 knows. */
const V2_FIELDS = ["from", "dockerfile", "steps", "start", "ready"] as const;

type TemplateDocument = Static<typeof TemplateSchema>;

export const TEMPLATE_FIELDS = Object.keys(TemplateSchema.properties);

/** The fields a table may have, by its JSON pointer in the document. */
function allowedFields(pointer: string): string[] {
  if (pointer === "") return TEMPLATE_FIELDS;
  if (/^\/files\/\d+$/.test(pointer)) return Object.keys(TemplateFileSchema.properties);
  if (/^\/steps\/\d+$/.test(pointer)) return Object.keys(StepSchema.properties);
  if (pointer === "/from") return Object.keys(FromSchema.properties);
  if (pointer === "/dockerfile") return Object.keys(DockerfileSchema.properties);
  if (pointer === "/egress") return Object.keys(EgressSchema.properties);
  return ["command", "user", "cwd", "env", "timeout_s", "interval_ms"];
}

function schemaErrors(file: string, doc: unknown): string[] {
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const error of Value.Errors(TemplateSchema, doc)) {
    const field = fieldName(error.path);
    if (seen.has(error.path)) continue;
    seen.add(error.path);
    if (error.message === "Unexpected property") {
      const parent = error.path.split("/").slice(0, -1).join("/");
      const allowed = allowedFields(parent);
      problems.push(`${file}: unknown field "${field}" (allowed: ${allowed.join(", ")})`);
    } else if (error.message === "Expected required property") {
      problems.push(`${file}: field "${field}" is required`);
    } else {
      const rule = (error.schema as TSchema & { rule?: string }).rule ?? error.message;
      problems.push(`${file}: field "${field}" ${rule} (got ${describeValue(error.value)})`);
    }
  }
  return problems;
}

function parseMode(mode: number | string | undefined): number {
  if (mode === undefined) return 0o644;
  return typeof mode === "number" ? mode : Number.parseInt(mode, 8);
}

async function checkFiles(file: string, doc: TemplateDocument, problems: string[]): Promise<TemplateFile[]> {
  const templateDir = path.dirname(file);
  const realTemplateDir = await fs.realpath(templateDir);
  const files: TemplateFile[] = [];
  const dests = new Set<string>();
  for (const [i, entry] of (doc.files ?? []).entries()) {
    const field = `files[${i}]`;
    const srcSegments = entry.src.split(/[\\/]/);
    if (path.isAbsolute(entry.src) || entry.src.startsWith("~")) {
      problems.push(
        `${file}: field "${field}.src" must be relative to the template file (got ${describeValue(entry.src)})`,
      );
      continue;
    }
    if (srcSegments.includes("..")) {
      problems.push(`${file}: field "${field}.src" must not contain ".." (got ${describeValue(entry.src)})`);
      continue;
    }
    const dest = entry.dest;
    if (
      !dest.startsWith("/") ||
      path.posix.normalize(dest) !== dest ||
      dest.endsWith("/") ||
      dest.includes("\0")
    ) {
      problems.push(
        `${file}: field "${field}.dest" must be a normalized absolute guest path without a trailing '/' (got ${describeValue(dest)})`,
      );
      continue;
    }
    const reserved = RESERVED_GUEST_DIRS.find((dir) => dest === dir || dest.startsWith(`${dir}/`));
    if (reserved) {
      problems.push(
        `${file}: field "${field}.dest" must not be under ${reserved}, which the guest reserves or mounts over`,
      );
      continue;
    }
    if (dests.has(dest)) {
      problems.push(`${file}: field "${field}.dest" repeats ${dest}; each destination may appear once`);
      continue;
    }
    dests.add(dest);
    const src = path.resolve(templateDir, entry.src);
    let realSrc: string;
    try {
      realSrc = await fs.realpath(src);
    } catch {
      problems.push(`${file}: field "${field}.src" names a file that does not exist: ${src}`);
      continue;
    }
    if (!isInside(realTemplateDir, realSrc)) {
      problems.push(`${file}: field "${field}.src" resolves outside the template's directory (${realSrc})`);
      continue;
    }
    if (!(await fs.stat(realSrc)).isFile()) {
      problems.push(`${file}: field "${field}.src" must be a regular file: ${src}`);
      continue;
    }
    files.push({ src: realSrc, srcRelative: entry.src, dest, mode: parseMode(entry.mode) });
  }
  return files;
}

/** Parses and validates template text; `file` is used in error messages and to resolve extra files. */
export async function parseTemplate(text: string, file: string, builtin = false): Promise<Template> {
  const source = path.resolve(file);
  let doc: unknown;
  try {
    doc = parseToml(text);
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    throw invalidArgument(`${source}: invalid TOML: ${message}`);
  }
  const problems = schemaErrors(source, doc);
  if (problems.length > 0) throw templateError(problems);
  const valid = doc as TemplateDocument;
  const format = valid.format ?? TEMPLATE_DEFAULTS.format;
  if (format === 1) {
    const v2Only = V2_FIELDS.filter((f) => valid[f] !== undefined);
    for (const f of v2Only)
      problems.push(
        `${source}: field "${f}" needs format = 2 (this template has no format field, so it is format 1)`,
      );
  }
  // Format 2 asks for an interpreter explicitly: an image from elsewhere may have no Python at all.
  const interpreter = valid.interpreter ?? (format === 2 ? "none" : TEMPLATE_DEFAULTS.interpreter);
  if (valid.warmup !== undefined && interpreter !== "python") {
    problems.push(
      `${source}: field "warmup" is only allowed with interpreter = "python" (interpreter is "${interpreter}")`,
    );
  }
  if (valid.egress !== undefined && valid.network === "none") {
    problems.push(`${source}: field "egress" needs a NIC, and this template says network = "none"`);
  }
  const files = await checkFiles(source, valid, problems);
  const v2 = format === 2 ? await checkV2(source, valid as V2Document, problems) : undefined;
  if (problems.length > 0) throw templateError(problems);
  return {
    name: valid.name,
    description: valid.description ?? TEMPLATE_DEFAULTS.description,
    packages: [...new Set(valid.packages ?? [])],
    memoryMib: valid.memory_mib ?? TEMPLATE_DEFAULTS.memory_mib,
    vcpus: valid.vcpus ?? TEMPLATE_DEFAULTS.vcpus,
    diskMib: valid.disk_mib ?? TEMPLATE_DEFAULTS.disk_mib,
    interpreter,
    warmup: valid.warmup,
    files,
    format,
    base: v2?.source ?? { kind: "debian", suite: "" },
    steps: v2?.steps ?? [],
    start: v2?.start,
    ready: v2?.ready,
    network: valid.network ?? "nic",
    egress: valid.egress && {
      default: valid.egress.default,
      allowOut: valid.egress.allow_out ?? [],
      denyOut: valid.egress.deny_out ?? [],
    },
    source,
    builtin,
  };
}

function templateError(problems: string[]): ForkdError {
  const message = problems.length === 1 ? problems[0]! : `invalid template:\n  ${problems.join("\n  ")}`;
  return new ForkdError("invalid_argument", message, { detail: { problems } });
}

async function readTemplateFile(file: string): Promise<string> {
  let stat: Awaited<ReturnType<typeof fs.stat>>;
  try {
    stat = await fs.stat(file);
  } catch {
    throw new ForkdError("not_found", `template file not found: ${file}`);
  }
  if (!stat.isFile()) throw invalidArgument(`${file}: not a regular file`);
  if (stat.size > TEMPLATE_LIMITS.templateFileBytes) {
    throw invalidArgument(`${file}: template file larger than ${TEMPLATE_LIMITS.templateFileBytes} bytes`);
  }
  return fs.readFile(file, "utf8");
}

/** A recipe directory holds its template under this name, beside its README and files. */
export const RECIPE_TEMPLATE_FILE = "template.toml";

/** templates/<name>.toml, or templates/<name>/template.toml for a recipe with files of its own. */
async function builtinTemplateFile(name: string): Promise<string | undefined> {
  const dir = builtinTemplatesDir();
  for (const file of [path.join(dir, `${name}.toml`), path.join(dir, name, RECIPE_TEMPLATE_FILE)]) {
    if ((await fs.stat(file).catch(() => undefined))?.isFile()) return file;
  }
  return undefined;
}

/**
 * A built-in template by name (templates/<name>.toml or templates/<name>/template.toml in the forkd package)
 * or, with `allowFiles` (the CLI, acting for the user who runs it), a template file by path: anything containing
 * '/' or ending in .toml, relative to the working directory. Names that come from an API caller never load a
 * file: the daemon runs as root, and its working directory is not the caller's.
 */
export async function loadTemplate(
  nameOrPath: string,
  options: { allowFiles?: boolean } = {},
): Promise<Template> {
  if (typeof nameOrPath !== "string" || nameOrPath === "")
    throw invalidArgument("template name or path is required");
  const looksLikeFile = nameOrPath.includes("/") || nameOrPath.endsWith(".toml");
  if (looksLikeFile && !options.allowFiles) {
    throw invalidArgument(
      `template ${JSON.stringify(nameOrPath)} looks like a file path; the daemon takes template names only ` +
        "(build from a template file with the CLI: forkd snapshot --template FILE)",
    );
  }
  if (looksLikeFile) {
    const file = path.resolve(nameOrPath);
    return parseTemplate(await readTemplateFile(file), file);
  }
  const name = assertTemplateName(nameOrPath);
  const file = await builtinTemplateFile(name);
  if (file === undefined) {
    const available = await listTemplateNames();
    throw new ForkdError(
      "not_found",
      `no built-in template named "${name}" (available: ${available.join(", ") || "none"}); ` +
        "pass a path to a .toml file to use your own",
    );
  }
  const template = await parseTemplate(await readTemplateFile(file), file, true);
  if (template.name !== name) {
    throw invalidArgument(
      `${file}: field "name" is "${template.name}" but the template is found as ${name} (its file or directory name)`,
    );
  }
  return template;
}

/** Names of the built-in templates and recipes, sorted. */
export async function listTemplateNames(): Promise<string[]> {
  const dir = builtinTemplatesDir();
  let entries: string[];
  try {
    entries = await fs.readdir(dir);
  } catch {
    return [];
  }
  const names = new Set<string>();
  for (const entry of entries) {
    const name = entry.endsWith(".toml") ? entry.slice(0, -5) : entry;
    if (!isValidTag(name)) continue;
    if (entry.endsWith(".toml") || (await builtinTemplateFile(name)) !== undefined) names.add(name);
  }
  return [...names].sort();
}

/** The built-in templates, parsed and validated (those that fail to load are left out: see listTemplateEntries). */
export async function listTemplates(): Promise<Template[]> {
  const entries = await listTemplateEntries();
  return entries.flatMap((e) => (e.template ? [e.template] : []));
}

/** Every built-in template with either its parsed form or why it cannot be loaded here. */
export async function listTemplateEntries(): Promise<
  { name: string; template?: Template; error?: string }[]
> {
  const names = await listTemplateNames();
  return Promise.all(
    names.map(async (name) => {
      try {
        return { name, template: await loadTemplate(name) };
      } catch (err) {
        return { name, error: err instanceof Error ? err.message : String(err) };
      }
    }),
  );
}
