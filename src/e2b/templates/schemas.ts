/**
 * E2B's template-build contract (read from the `e2b` SDKs' generated API clients: TemplateBuildRequestV3,
 * TemplateRequestResponseV3, TemplateBuildStartV2, TemplateStep, TemplateBuildFileUpload, TemplateBuildInfo,
 * BuildLogEntry, TemplateWithBuilds, the tag requests), declared once for validation and the E2B OpenAPI document.
 */
import { Type } from "@sinclair/typebox";
import {
  MAX_TEMPLATE_BUILD_STEPS,
  MAX_TEMPLATE_CPU_COUNT,
  MAX_TEMPLATE_DISK_MIB,
  MAX_TEMPLATE_MEMORY_MIB,
  MAX_TEMPLATE_STEP_ARG_CHARS,
  MAX_TEMPLATE_STEP_ARGS,
  MIN_TEMPLATE_MEMORY_MIB,
} from "../../common/limits.js";

const Nullable = <T extends ReturnType<typeof Type.String>>(schema: T) => Type.Union([schema, Type.Null()]);
const open = { additionalProperties: true } as const;
const LIMITS = {
  steps: MAX_TEMPLATE_BUILD_STEPS,
  args: MAX_TEMPLATE_STEP_ARGS,
  argChars: MAX_TEMPLATE_STEP_ARG_CHARS,
};

export const BuildRequestV3 = Type.Object(
  {
    name: Type.Optional(Type.String({ maxLength: 256, description: "`name` or `name:tag`." })),
    alias: Type.Optional(Type.String({ maxLength: 256, description: "Deprecated: the name." })),
    tags: Type.Optional(Type.Array(Type.String({ maxLength: 64 }), { maxItems: 64 })),
    teamID: Type.Optional(Type.String({ description: "Ignored: the API key's tenant is the team." })),
    cpuCount: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_TEMPLATE_CPU_COUNT })),
    memoryMB: Type.Optional(
      Type.Integer({ minimum: MIN_TEMPLATE_MEMORY_MIB, maximum: MAX_TEMPLATE_MEMORY_MIB }),
    ),
    minFreeDiskMb: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_TEMPLATE_DISK_MIB })),
  },
  open,
);

export const BuildRequestResponseV3 = Type.Object({
  templateID: Type.String(),
  buildID: Type.String({ format: "uuid" }),
  public: Type.Boolean(),
  names: Type.Array(Type.String()),
  tags: Type.Array(Type.String()),
  aliases: Type.Array(Type.String()),
});

export const TemplateStep = Type.Object(
  {
    type: Type.String({ maxLength: 32, description: "RUN, COPY, ENV, WORKDIR or USER." }),
    args: Type.Optional(
      Type.Union([
        Type.Array(Type.String({ maxLength: LIMITS.argChars }), { maxItems: LIMITS.args }),
        Type.Null(),
      ]),
    ),
    filesHash: Type.Optional(Nullable(Type.String({ pattern: "^[a-f0-9]{64}$" }))),
    force: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
    forceUpload: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  },
  open,
);

export const BuildStartV2 = Type.Object(
  {
    fromImage: Type.Optional(Nullable(Type.String({ maxLength: 512 }))),
    fromTemplate: Type.Optional(Nullable(Type.String({ maxLength: 256 }))),
    fromImageRegistry: Type.Optional(Type.Union([Type.Object({}, open), Type.Null()])),
    force: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
    steps: Type.Optional(Type.Union([Type.Array(TemplateStep, { maxItems: LIMITS.steps }), Type.Null()])),
    startCmd: Type.Optional(Nullable(Type.String({ maxLength: LIMITS.argChars }))),
    readyCmd: Type.Optional(Nullable(Type.String({ maxLength: LIMITS.argChars }))),
  },
  open,
);

export const FileUploadLink = Type.Object({
  present: Type.Boolean({ description: "Whether this tenant already uploaded files under the hash." }),
  url: Type.Optional(Type.String({ description: "Where to PUT the archive (signed, expires)." })),
  headers: Type.Optional(Type.Record(Type.String(), Type.String())),
});

export const LogEntry = Type.Object({
  timestamp: Type.String({ format: "date-time" }),
  message: Type.String(),
  level: Type.Union([
    Type.Literal("debug"),
    Type.Literal("info"),
    Type.Literal("warn"),
    Type.Literal("error"),
  ]),
  step: Type.Optional(Type.String()),
});

const BuildStatus = Type.Union([
  Type.Literal("building"),
  Type.Literal("waiting"),
  Type.Literal("ready"),
  Type.Literal("error"),
]);

export const BuildInfo = Type.Object({
  templateID: Type.String(),
  buildID: Type.String(),
  status: BuildStatus,
  logs: Type.Array(Type.String(), { description: "Always empty (E2B's V1 field); see logEntries." }),
  logEntries: Type.Array(LogEntry),
  reason: Type.Optional(
    Type.Object({
      message: Type.String(),
      step: Type.Optional(Type.String({ description: "base, the SDK's step number, or finalize." })),
      logEntries: Type.Optional(Type.Array(LogEntry)),
    }),
  ),
});

export const BuildLogs = Type.Object({ logs: Type.Array(LogEntry) });

const TemplateBuild = Type.Object({
  buildID: Type.String(),
  status: BuildStatus,
  createdAt: Type.String({ format: "date-time" }),
  updatedAt: Type.String({ format: "date-time" }),
  finishedAt: Type.Optional(Type.String({ format: "date-time" })),
  cpuCount: Type.Integer(),
  memoryMB: Type.Integer(),
  diskSizeMB: Type.Optional(Type.Integer()),
  envdVersion: Type.Optional(Type.String()),
});

export const TemplateWithBuilds = Type.Object({
  templateID: Type.String(),
  buildID: Type.String(),
  cpuCount: Type.Integer(),
  memoryMB: Type.Integer(),
  diskSizeMB: Type.Integer(),
  public: Type.Boolean(),
  aliases: Type.Array(Type.String()),
  names: Type.Array(Type.String()),
  createdAt: Type.String({ format: "date-time" }),
  updatedAt: Type.String({ format: "date-time" }),
  createdBy: Type.Null(),
  lastSpawnedAt: Type.Null(),
  spawnCount: Type.Integer(),
  buildCount: Type.Integer(),
  envdVersion: Type.String(),
  buildStatus: BuildStatus,
  builds: Type.Array(TemplateBuild),
});

export const AssignTags = Type.Object(
  {
    target: Type.String({ maxLength: 256, description: "`name:tag` (or `name`: its newest ready build)." }),
    tags: Type.Array(Type.String({ maxLength: 64 }), { minItems: 1, maxItems: 64 }),
  },
  open,
);
export const AssignedTags = Type.Object({ tags: Type.Array(Type.String()), buildID: Type.String() });
export const DeleteTags = Type.Object(
  {
    name: Type.String({ maxLength: 256 }),
    tags: Type.Array(Type.String({ maxLength: 64 }), { minItems: 1, maxItems: 64 }),
  },
  open,
);
export const TemplateTagList = Type.Array(
  Type.Object({
    tag: Type.String(),
    buildID: Type.String(),
    createdAt: Type.String({ format: "date-time" }),
  }),
);

export const BuildParams = Type.Object({
  templateID: Type.String({ maxLength: 256 }),
  buildID: Type.String({ maxLength: 64 }),
});
export const FilesParams = Type.Object({
  templateID: Type.String({ maxLength: 256 }),
  hash: Type.String({ pattern: "^[a-f0-9]{64}$" }),
});
export const StatusQuery = Type.Object({
  logsOffset: Type.Optional(Type.Integer({ minimum: 0 })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
  level: Type.Optional(Type.String()),
});
export const LogsQuery = Type.Object({
  cursor: Type.Optional(
    Type.Integer({ minimum: 0, description: "Entries to skip (an offset into the log)." }),
  ),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
  direction: Type.Optional(Type.String()),
  level: Type.Optional(Type.String()),
  source: Type.Optional(Type.String()),
});
export const UploadQuery = Type.Object({
  owner: Type.String({ maxLength: 256 }),
  expires: Type.Integer(),
  signature: Type.String({ pattern: "^[a-f0-9]{64}$" }),
});
