/**
 * Template format 2: where the root filesystem comes from (`from`, `dockerfile`), the build steps applied on
 * top of it (`[[steps]]`), and the commands a snapshot's parent runs before it is saved (`start`, `ready`).
 * The schema here only shapes the TOML; the rules that need more than one field (exactly one kind per step,
 * host paths inside the template's directory) are checked by `checkV2`, which reports every problem at once.
 */
import { Type } from "@sinclair/typebox";
import {
  DEFAULT_READY_INTERVAL_MS,
  DEFAULT_READY_TIMEOUT_S,
  GUEST_USER_NAME_PATTERN,
  MAX_GUEST_CWD_CHARS,
  MAX_READY_INTERVAL_MS,
  MAX_READY_TIMEOUT_S,
  MAX_TEMPLATE_COMMAND_ARGV,
  MAX_TEMPLATE_COMMAND_CHARS,
  MAX_TEMPLATE_COMMAND_ENV,
  MAX_TEMPLATE_ENV_VALUE_CHARS,
  MIN_READY_INTERVAL_MS,
  MIN_READY_TIMEOUT_S,
  TAG_PATTERN,
} from "../common/limits.js";
import { IMAGE_REFERENCE } from "../common/names.js";
import {
  describeValue,
  ENV_NAME,
  intInRange,
  isNormalizedGuestPath,
  resolveTemplatePath,
} from "./template-fields.js";

/** Declared with the other names in src/common (cluster objects carry references too). */
export { IMAGE_REFERENCE };

export type ImageSource =
  | { kind: "debian"; suite: string }
  | { kind: "oci-layout"; path: string; pathRelative: string; ref: string | undefined }
  | { kind: "archive"; path: string; pathRelative: string; ref: string | undefined }
  | { kind: "registry"; ref: string; insecure: boolean }
  | {
      kind: "dockerfile";
      file: string;
      fileRelative: string;
      context: string;
      contextRelative: string;
      args: Record<string, string>;
      target: string | undefined;
      network: boolean;
    };

/** What every step may carry: `cache = false` runs it (and so every step after it) on every build. */
interface StepCommon {
  cache: boolean;
}

export type TemplateStep = StepCommon &
  (
    | { kind: "run"; argv: string[]; network: boolean; timeoutS: number }
    | {
        kind: "copy";
        src: string;
        srcRelative: string;
        dest: string;
        mode: number | undefined;
        owner: string | undefined;
      }
    | { kind: "env"; env: Record<string, string> }
    | { kind: "workdir"; path: string }
    | { kind: "user"; user: string }
    | {
        kind: "pip";
        /** A requirements file (host path), or undefined with `packages`. */
        requirements: string | undefined;
        requirementsRelative: string | undefined;
        /** Requirement specifiers (`numpy`, `pandas==2.2.*`), or empty with `requirements`. */
        packages: string[];
        wheels: string | undefined;
        wheelsRelative: string | undefined;
        /** An index URL; neither this nor wheels: the machine's configured pip indexes (package-config.ts). */
        index: string | undefined;
        timeoutS: number;
      }
    | { kind: "apt"; packages: string[]; recommends: boolean; timeoutS: number }
    | { kind: "npm"; packages: string[]; global: boolean; timeoutS: number }
    | { kind: "adduser"; name: string }
  );

export type StepKind = TemplateStep["kind"];

/** A command the parent VM runs (through the guest agent): argv, and optionally who, where and with what. */
export interface TemplateCommand {
  argv: string[];
  user: string | undefined;
  cwd: string | undefined;
  env: Record<string, string>;
}

export interface ReadyCheck extends TemplateCommand {
  /** How long the parent may take to become ready before the snapshot is abandoned. */
  timeoutMs: number;
  /** Pause between two attempts. */
  intervalMs: number;
}

export const V2_LIMITS = {
  steps: 128,
  commandChars: MAX_TEMPLATE_COMMAND_CHARS,
  argvItems: MAX_TEMPLATE_COMMAND_ARGV,
  envEntries: MAX_TEMPLATE_COMMAND_ENV,
  envValueChars: MAX_TEMPLATE_ENV_VALUE_CHARS,
  stepTimeoutS: { min: 1, max: 24 * 3600, default: 3600 },
  readyTimeoutS: { min: MIN_READY_TIMEOUT_S, max: MAX_READY_TIMEOUT_S, default: DEFAULT_READY_TIMEOUT_S },
  readyIntervalMs: {
    min: MIN_READY_INTERVAL_MS,
    max: MAX_READY_INTERVAL_MS,
    default: DEFAULT_READY_INTERVAL_MS,
  },
  buildArgs: 128,
  packages: 256,
  packageChars: 256,
};

/** A Debian codename (the only suite the host's own apt sources serve is the host's). */
const SUITE_PATTERN = "^[a-z][a-z0-9-]{1,31}$";
/** A tag or name inside an OCI layout or archive (`org.opencontainers.image.ref.name`, or name:tag). */
const LOCAL_REF_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}$";
/** A user as `user` steps and commands may name it: a name of the image's passwd, or uid[:gid]. */
const USER_PATTERN =
  "^(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})(?::(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}))?$";

/** A pip requirement specifier (PEP 508): starts with a letter or digit, so it can never be read as an option. */
const PIP_REQUIREMENT = "^[A-Za-z0-9][^\\x00-\\x1f]{0,255}$";
/** A Debian package name (Policy 5.6.1), optionally `=version` or `/suite`. */
const APT_PACKAGE = "^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+~:-]+|/[a-z0-9.-]+)?$";
/** An npm registry package, optionally scoped and with `@version` or `@tag` (no URLs, paths or git specs). */
const NPM_PACKAGE = "^(?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(?:@[A-Za-z0-9^~<>=.*+|_ -]{1,100})?$";
/** A user name as `adduser` makes it (what useradd accepts by default). */
const ACCOUNT_NAME = "^[a-z_][a-z0-9_-]{0,31}$";

const packageList = (pattern: string, what: string) =>
  Type.Array(Type.String({ pattern, rule: `must be one of ${what}` }), {
    minItems: 1,
    maxItems: V2_LIMITS.packages,
    rule: `must be a non-empty list of at most ${V2_LIMITS.packages} ${what}`,
  });

const commandText = Type.String({
  minLength: 1,
  maxLength: V2_LIMITS.commandChars,
  rule: `must be a non-empty shell command of at most ${V2_LIMITS.commandChars} characters`,
});
const argvArray = Type.Array(Type.String({ maxLength: V2_LIMITS.commandChars }), {
  minItems: 1,
  maxItems: V2_LIMITS.argvItems,
  rule: "must be a non-empty list of strings (argv, no shell)",
});
const envTable = Type.Record(Type.String(), Type.String({ maxLength: V2_LIMITS.envValueChars }), {
  rule: 'must be a table of NAME = "value" strings',
});
const relativePath = (what: string) =>
  Type.String({ minLength: 1, maxLength: 1024, rule: `must be a ${what} relative to the template file` });

export const FromSchema = Type.Object(
  {
    debian: Type.Optional(Type.String({ pattern: SUITE_PATTERN, rule: "must be a Debian codename" })),
    oci: Type.Optional(relativePath("path of an OCI image layout directory")),
    archive: Type.Optional(relativePath("path of an OCI or Docker archive (tar)")),
    image: Type.Optional(
      Type.String({ maxLength: 512, rule: "must be an image reference like host:5000/name:tag" }),
    ),
    ref: Type.Optional(
      Type.String({ pattern: LOCAL_REF_PATTERN, rule: "must name an image inside the layout or archive" }),
    ),
    insecure: Type.Optional(Type.Boolean({ rule: "must be true or false" })),
  },
  { additionalProperties: false, rule: "must be a table with one of debian, oci, archive, image" },
);

export const DockerfileSchema = Type.Object(
  {
    file: Type.Optional(relativePath("path of a Dockerfile")),
    context: Type.Optional(relativePath("directory (the build context)")),
    args: Type.Optional(envTable),
    target: Type.Optional(Type.String({ pattern: TAG_PATTERN, rule: "must be a stage name" })),
    network: Type.Optional(Type.Boolean({ rule: "must be true or false" })),
  },
  { additionalProperties: false, rule: "must be a table with file, context, args, target, network" },
);

export const StepSchema = Type.Object(
  {
    run: Type.Optional(
      Type.Union([commandText, argvArray], { rule: "must be a shell command or an argv list" }),
    ),
    copy: Type.Optional(relativePath("file or directory")),
    dest: Type.Optional(
      Type.String({ minLength: 1, maxLength: 1024, rule: "must be an absolute guest path" }),
    ),
    mode: Type.Optional(
      Type.Union([Type.Integer({ minimum: 0, maximum: 0o7777 }), Type.String({ pattern: "^[0-7]{3,4}$" })], {
        rule: 'must be an octal permission like "0644"',
      }),
    ),
    owner: Type.Optional(
      Type.String({ pattern: USER_PATTERN, rule: "must be user[:group] (names or numbers)" }),
    ),
    env: Type.Optional(envTable),
    workdir: Type.Optional(
      Type.String({ minLength: 1, maxLength: 1024, rule: "must be an absolute guest path" }),
    ),
    user: Type.Optional(
      Type.String({ pattern: USER_PATTERN, rule: "must be user[:group] (names or numbers)" }),
    ),
    pip: Type.Optional(
      Type.Union(
        [relativePath("requirements file"), packageList(PIP_REQUIREMENT, "requirement specifiers")],
        {
          rule: "must be a requirements file next to the template or a list of requirement specifiers",
        },
      ),
    ),
    apt: Type.Optional(packageList(APT_PACKAGE, "Debian package names (name, name=version or name/suite)")),
    npm: Type.Optional(packageList(NPM_PACKAGE, "npm package names (name, @scope/name, name@version)")),
    adduser: Type.Optional(
      Type.String({ pattern: ACCOUNT_NAME, rule: "must be a user name ([a-z_][a-z0-9_-]{0,31})" }),
    ),
    recommends: Type.Optional(Type.Boolean({ rule: "must be true or false" })),
    global: Type.Optional(Type.Boolean({ rule: "must be true or false" })),
    cache: Type.Optional(Type.Boolean({ rule: "must be true or false" })),
    wheels: Type.Optional(relativePath("directory of wheels")),
    index: Type.Optional(
      Type.String({
        pattern: "^https?://[^\\s]{1,1000}$",
        rule: "must be an http(s) URL of a package index",
      }),
    ),
    network: Type.Optional(Type.Boolean({ rule: "must be true or false" })),
    timeout_s: Type.Optional(intInRange(V2_LIMITS.stepTimeoutS.min, V2_LIMITS.stepTimeoutS.max)),
  },
  { additionalProperties: false, rule: "must be a table" },
);

const CommandTableSchema = Type.Object(
  {
    command: Type.Union([commandText, argvArray], { rule: "must be a shell command or an argv list" }),
    user: Type.Optional(
      Type.String({ pattern: GUEST_USER_NAME_PATTERN, rule: "must be the name of a user of the image" }),
    ),
    cwd: Type.Optional(
      Type.String({ minLength: 1, maxLength: MAX_GUEST_CWD_CHARS, rule: "must be an absolute guest path" }),
    ),
    env: Type.Optional(envTable),
    timeout_s: Type.Optional(intInRange(V2_LIMITS.readyTimeoutS.min, V2_LIMITS.readyTimeoutS.max)),
    interval_ms: Type.Optional(intInRange(V2_LIMITS.readyIntervalMs.min, V2_LIMITS.readyIntervalMs.max)),
  },
  { additionalProperties: false },
);

export const CommandSchema = Type.Union([commandText, argvArray, CommandTableSchema], {
  rule: "must be a shell command, an argv list, or a table with command (and user, cwd, env, timeout_s, interval_ms)",
});

/** The keys each step kind may carry besides its own. */
const STEP_MODIFIERS: Record<StepKind, string[]> = {
  run: ["network", "timeout_s", "cache"],
  copy: ["dest", "mode", "owner", "cache"],
  env: ["cache"],
  workdir: ["cache"],
  user: ["cache"],
  pip: ["wheels", "index", "timeout_s", "cache"],
  apt: ["recommends", "timeout_s", "cache"],
  npm: ["global", "timeout_s", "cache"],
  adduser: ["cache"],
};
const STEP_KINDS: StepKind[] = ["run", "copy", "env", "workdir", "user", "pip", "apt", "npm", "adduser"];
/** The key that names each step's kind in a template (`pip` steps are spelt `pip = "requirements.txt"`). */
export const STEP_KEYS = STEP_KINDS;

type StepDoc = {
  run?: string | string[];
  copy?: string;
  dest?: string;
  mode?: number | string;
  owner?: string;
  env?: Record<string, string>;
  workdir?: string;
  user?: string;
  pip?: string | string[];
  apt?: string[];
  npm?: string[];
  adduser?: string;
  recommends?: boolean;
  global?: boolean;
  cache?: boolean;
  wheels?: string;
  index?: string;
  network?: boolean;
  timeout_s?: number;
};
type FromDoc = {
  debian?: string;
  oci?: string;
  archive?: string;
  image?: string;
  ref?: string;
  insecure?: boolean;
};
type DockerfileDoc = {
  file?: string;
  context?: string;
  args?: Record<string, string>;
  target?: string;
  network?: boolean;
};
type CommandTableDoc = {
  command: string | string[];
  user?: string;
  cwd?: string;
  env?: Record<string, string>;
  timeout_s?: number;
  interval_ms?: number;
};
type CommandDoc = string | string[] | CommandTableDoc;

export interface V2Document {
  from?: FromDoc;
  dockerfile?: DockerfileDoc;
  steps?: StepDoc[];
  start?: CommandDoc;
  ready?: CommandDoc;
  packages?: string[];
}

export interface V2Parts {
  source: ImageSource;
  steps: TemplateStep[];
  start: TemplateCommand | undefined;
  ready: ReadyCheck | undefined;
}

/** A shell command runs as `/bin/sh -c <command>` (the image's own shell); a list is argv as is. */
export function commandArgv(command: string | string[]): string[] {
  return typeof command === "string" ? ["/bin/sh", "-c", command] : [...command];
}

function checkEnv(file: string, field: string, env: Record<string, string>, problems: string[]): boolean {
  const names = Object.keys(env);
  if (names.length > V2_LIMITS.envEntries) {
    problems.push(`${file}: field "${field}" has more than ${V2_LIMITS.envEntries} entries`);
    return false;
  }
  for (const name of names) {
    if (!ENV_NAME.test(name)) {
      problems.push(
        `${file}: field "${field}.${name}" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)`,
      );
      return false;
    }
    if (env[name]?.includes("\0")) {
      problems.push(`${file}: field "${field}.${name}" must not contain NUL`);
      return false;
    }
  }
  return true;
}

function checkGuestPath(file: string, field: string, value: string, problems: string[]): boolean {
  if (isNormalizedGuestPath(value)) return true;
  problems.push(
    `${file}: field "${field}" must be a normalized absolute guest path without a trailing '/' (got ${describeValue(value)})`,
  );
  return false;
}

async function checkSource(
  file: string,
  doc: V2Document,
  problems: string[],
): Promise<ImageSource | undefined> {
  if (doc.from !== undefined && doc.dockerfile !== undefined) {
    problems.push(
      `${file}: fields "from" and "dockerfile" exclude each other (a Dockerfile names its own FROM)`,
    );
    return undefined;
  }
  if (doc.dockerfile !== undefined) return checkDockerfileSource(file, doc.dockerfile, problems);
  return checkFromSource(file, doc, problems);
}

/** The `[dockerfile]` table: its context directory and Dockerfile (inside the template's folder), build args. */
async function checkDockerfileSource(
  file: string,
  d: NonNullable<V2Document["dockerfile"]>,
  problems: string[],
): Promise<ImageSource | undefined> {
  const contextRelative = d.context ?? ".";
  const context = await resolveTemplatePath(
    file,
    "dockerfile.context",
    contextRelative,
    "directory",
    problems,
  );
  const fileRelative = d.file ?? (contextRelative === "." ? "Dockerfile" : `${contextRelative}/Dockerfile`);
  const dockerfile = await resolveTemplatePath(file, "dockerfile.file", fileRelative, "file", problems);
  const args = { ...d.args };
  if (Object.keys(args).length > V2_LIMITS.buildArgs) {
    problems.push(`${file}: field "dockerfile.args" has more than ${V2_LIMITS.buildArgs} entries`);
  } else checkEnv(file, "dockerfile.args", args, problems);
  if (!context || !dockerfile) return undefined;
  return {
    kind: "dockerfile",
    file: dockerfile,
    fileRelative,
    context,
    contextRelative,
    args,
    target: d.target,
    network: d.network ?? false,
  };
}

/** The `[from]` table (Debian when absent): exactly one base kind, and only the fields that go with it. */
async function checkFromSource(
  file: string,
  doc: V2Document,
  problems: string[],
): Promise<ImageSource | undefined> {
  const from = doc.from ?? {};
  const kinds = (["debian", "oci", "archive", "image"] as const).filter((k) => from[k] !== undefined);
  if (doc.from !== undefined && kinds.length !== 1) {
    problems.push(
      `${file}: field "from" must have exactly one of debian, oci, archive, image (got ${kinds.join(", ") || "none"})`,
    );
    return undefined;
  }
  const kind = kinds[0] ?? "debian";
  if (from.ref !== undefined && kind !== "oci" && kind !== "archive") {
    problems.push(`${file}: field "from.ref" only goes with from.oci or from.archive`);
  }
  if (from.insecure !== undefined && kind !== "image") {
    problems.push(`${file}: field "from.insecure" only goes with from.image`);
  }
  if (doc.packages !== undefined && doc.packages.length > 0 && kind !== "debian") {
    problems.push(
      `${file}: field "packages" only goes with a Debian base (from.debian); use a run step to install packages in an image`,
    );
  }
  switch (kind) {
    case "debian":
      return { kind: "debian", suite: from.debian ?? "" };
    case "image": {
      const ref = from.image as string;
      if (!IMAGE_REFERENCE.test(ref)) {
        problems.push(
          `${file}: field "from.image" must be an image reference like registry.example:5000/team/app:1.0 (got ${describeValue(ref)})`,
        );
        return undefined;
      }
      return { kind: "registry", ref, insecure: from.insecure ?? false };
    }
    case "oci":
    case "archive": {
      const relative = from[kind] as string;
      const found = await resolveTemplatePath(
        file,
        `from.${kind}`,
        relative,
        kind === "oci" ? "directory" : "file",
        problems,
      );
      if (!found) return undefined;
      return kind === "oci"
        ? { kind: "oci-layout", path: found, pathRelative: relative, ref: from.ref }
        : { kind: "archive", path: found, pathRelative: relative, ref: from.ref };
    }
  }
}

function parseMode(mode: number | string | undefined): number | undefined {
  if (mode === undefined) return undefined;
  return typeof mode === "number" ? mode : Number.parseInt(mode, 8);
}

async function checkStep(
  file: string,
  index: number,
  step: StepDoc,
  problems: string[],
): Promise<TemplateStep | undefined> {
  const field = `steps[${index}]`;
  const kind = stepKindOf(file, field, step, problems);
  if (kind === undefined) return undefined;
  const cache = step.cache ?? true;
  const timeoutS = step.timeout_s ?? V2_LIMITS.stepTimeoutS.default;
  switch (kind) {
    case "run":
      return {
        kind,
        cache,
        argv: commandArgv(step.run as string | string[]),
        network: step.network ?? false,
        timeoutS,
      };
    case "copy":
      return checkCopyStep(file, field, step, cache, problems);
    case "env":
      if (!checkEnv(file, `${field}.env`, step.env ?? {}, problems)) return undefined;
      return { kind, cache, env: { ...step.env } };
    case "workdir":
      if (!checkGuestPath(file, `${field}.workdir`, step.workdir as string, problems)) return undefined;
      return { kind, cache, path: step.workdir as string };
    case "user":
      return { kind, cache, user: step.user as string };
    case "pip":
      return checkPipStep(file, field, step, cache, timeoutS, problems);
    case "apt":
      return {
        kind,
        cache,
        packages: [...(step.apt as string[])],
        recommends: step.recommends ?? false,
        timeoutS,
      };
    case "npm":
      return { kind, cache, packages: [...(step.npm as string[])], global: step.global ?? false, timeoutS };
    case "adduser":
      return { kind, cache, name: step.adduser as string };
  }
}

/** The one step kind `step` names, with only the modifiers that go with it; undefined (and a problem) if not. */
function stepKindOf(file: string, field: string, step: StepDoc, problems: string[]): StepKind | undefined {
  const present = STEP_KINDS.filter((k) => step[k] !== undefined);
  if (present.length !== 1) {
    problems.push(
      `${file}: field "${field}" must have exactly one of ${STEP_KINDS.join(", ")} (got ${present.join(", ") || "none"})`,
    );
    return undefined;
  }
  const kind = present[0] as StepKind;
  const allowed = new Set<string>([kind, ...STEP_MODIFIERS[kind]]);
  const stray = Object.keys(step).filter((k) => !allowed.has(k));
  if (stray.length > 0) {
    problems.push(
      `${file}: field "${field}": ${stray.join(", ")} ${stray.length === 1 ? "does" : "do"} not go with a ${kind} step` +
        (STEP_MODIFIERS[kind].length > 0 ? ` (it takes ${STEP_MODIFIERS[kind].join(", ")})` : ""),
    );
    return undefined;
  }
  return kind;
}

async function checkCopyStep(
  file: string,
  field: string,
  step: StepDoc,
  cache: boolean,
  problems: string[],
): Promise<TemplateStep | undefined> {
  if (step.dest === undefined) {
    problems.push(`${file}: field "${field}.dest" is required for a copy step`);
    return undefined;
  }
  if (!checkGuestPath(file, `${field}.dest`, step.dest, problems)) return undefined;
  const src = await resolveTemplatePath(
    file,
    `${field}.copy`,
    step.copy as string,
    "file or directory",
    problems,
  );
  if (!src) return undefined;
  return {
    kind: "copy",
    cache,
    src,
    srcRelative: step.copy as string,
    dest: step.dest,
    mode: parseMode(step.mode),
    owner: step.owner,
  };
}

async function checkPipStep(
  file: string,
  field: string,
  step: StepDoc,
  cache: boolean,
  timeoutS: number,
  problems: string[],
): Promise<TemplateStep | undefined> {
  if (step.wheels !== undefined && step.index !== undefined) {
    problems.push(
      `${file}: field "${field}" takes at most one of wheels (a local directory, no network) or index (a package index URL); with neither, pip uses the machine's configured indexes`,
    );
    return undefined;
  }
  const list = Array.isArray(step.pip) ? step.pip : undefined;
  const requirementsRelative = typeof step.pip === "string" ? step.pip : undefined;
  const requirements =
    requirementsRelative === undefined
      ? undefined
      : await resolveTemplatePath(file, `${field}.pip`, requirementsRelative, "file", problems);
  const wheels =
    step.wheels === undefined
      ? undefined
      : await resolveTemplatePath(file, `${field}.wheels`, step.wheels, "directory", problems);
  if ((requirementsRelative !== undefined && !requirements) || (step.wheels !== undefined && !wheels)) {
    return undefined;
  }
  return {
    kind: "pip",
    cache,
    requirements,
    requirementsRelative,
    packages: list ? [...list] : [],
    wheels,
    wheelsRelative: step.wheels,
    index: step.index,
    timeoutS,
  };
}

function checkCommand(
  file: string,
  field: string,
  doc: CommandDoc | undefined,
  problems: string[],
): (TemplateCommand & { timeoutS?: number; intervalMs?: number }) | undefined {
  if (doc === undefined) return undefined;
  const table: CommandTableDoc = typeof doc === "string" || Array.isArray(doc) ? { command: doc } : doc;
  if (table.cwd !== undefined && !checkGuestPath(file, `${field}.cwd`, table.cwd, problems)) return undefined;
  if (table.env !== undefined && !checkEnv(file, `${field}.env`, table.env, problems)) return undefined;
  if (field === "start" && (table.timeout_s !== undefined || table.interval_ms !== undefined)) {
    problems.push(`${file}: field "start": timeout_s and interval_ms belong to ready`);
    return undefined;
  }
  return {
    argv: commandArgv(table.command),
    user: table.user,
    cwd: table.cwd,
    env: { ...table.env },
    timeoutS: table.timeout_s,
    intervalMs: table.interval_ms,
  };
}

/** Checks the format-2 fields of a schema-valid document; pushes every problem found. */
export async function checkV2(
  file: string,
  doc: V2Document,
  problems: string[],
): Promise<V2Parts | undefined> {
  const source = await checkSource(file, doc, problems);
  const steps: TemplateStep[] = [];
  for (const [i, step] of (doc.steps ?? []).entries()) {
    const checked = await checkStep(file, i, step, problems);
    if (checked) steps.push(checked);
  }
  const start = checkCommand(file, "start", doc.start, problems);
  const readyParts = checkCommand(file, "ready", doc.ready, problems);
  if (!source) return undefined;
  const ready: ReadyCheck | undefined = readyParts && {
    argv: readyParts.argv,
    user: readyParts.user,
    cwd: readyParts.cwd,
    env: readyParts.env,
    timeoutMs: (readyParts.timeoutS ?? V2_LIMITS.readyTimeoutS.default) * 1000,
    intervalMs: readyParts.intervalMs ?? V2_LIMITS.readyIntervalMs.default,
  };
  return {
    source,
    steps,
    start: start && { argv: start.argv, user: start.user, cwd: start.cwd, env: start.env },
    ready,
  };
}
