/**
 * E2B's REST contract as forkd serves it, declared once: these TypeBox schemas validate requests (through the
 * daemon's validator) and make the E2B OpenAPI document (docs/e2b-openapi.json). Names and shapes are E2B's
 * (camelCase, `sandboxID`, timeouts in seconds), read from the e2b SDK's generated API types. Request bodies
 * accept fields this server does not know, as E2B's server does; fields it knows but cannot honour are refused
 * by the routes with a message naming them.
 */
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import {
  MAX_SANDBOX_TIMEOUT_MS,
  MAX_SPAWN_N,
  SDK_SANDBOX_TIMEOUT_MS,
  TEMPLATE_ALIAS_PATTERN,
} from "../../common/limits.js";
import { PORT_PLACEHOLDER } from "../../controller/sandboxes/settings.js";

/** A field E2B's server models also take as null (meaning: not given). */
export const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);
const open = { additionalProperties: true } as const;

/** E2B sandbox lifetimes are whole seconds; forkd allows up to its own maximum. */
export const MAX_TIMEOUT_SECONDS = MAX_SANDBOX_TIMEOUT_MS / 1000;
/** E2B's default lifetime of a sandbox created or connected to (seconds): the SDKs' default. */
export const DEFAULT_TIMEOUT_SECONDS = SDK_SANDBOX_TIMEOUT_MS / 1000;
/** E2B's declared default lifetime of a fork (SandboxForkRequest.timeout, seconds). */
export const DEFAULT_FORK_TIMEOUT_SECONDS = 15;
export const MAX_FORK_COUNT = MAX_SPAWN_N;
export const DEFAULT_PAGE_LIMIT = 100;
export const MAX_PAGE_LIMIT = 1000;

export const ErrorBody = Type.Object(
  {
    code: Type.Integer({ description: "The HTTP status." }),
    message: Type.String(),
  },
  { description: "E2B's error body: the SDK turns `code` into its error classes." },
);
export const errorResponses = { "4xx": ErrorBody, "5xx": ErrorBody };

/** A JSON body the client may leave out (curl without -d); the SDK always sends one. */
export const OptionalBody = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Undefined()]);

const TimeoutSeconds = Type.Integer({
  minimum: 1,
  maximum: MAX_TIMEOUT_SECONDS,
  description: "Seconds from now until the sandbox is killed.",
});
const StringMap = (description: string) => Type.Record(Type.String(), Type.String(), { description });

export const SandboxIdParams = Type.Object({ sandboxID: Type.String({ maxLength: 128 }) });

const EgressEntries = (description: string) =>
  Type.Array(Type.String({ maxLength: 256 }), {
    description: `${description} IPv4 addresses, CIDR blocks, domain names, *.domain wildcards.`,
  });
const EgressFields = {
  allowOut: Type.Optional(EgressEntries("Destinations allowed; they win over denyOut.")),
  denyOut: Type.Optional(
    EgressEntries('Destinations denied; ALL_TRAFFIC ("0.0.0.0/0") denies whatever allowOut does not name.'),
  ),
  rules: Type.Optional(
    Type.Record(Type.String(), Type.Array(Type.Object({}, open)), {
      description: "Header transforms of outbound HTTPS requests: not supported (501 unless empty).",
    }),
  ),
  egressProxy: Type.Optional(
    Nullable(Type.Object({}, { ...open, description: "SOCKS5 egress proxy: not supported (501)." })),
  ),
  dnsServers: Type.Optional(
    Type.Array(Type.String({ maxLength: 64 }), {
      maxItems: 64,
      description:
        "IPv4 DNS servers the sandbox may reach when allowOut names a domain (added to allowOut then). Names " +
        "resolve through the sandbox's own DNS forwarder, so none is needed; E2B's default 8.8.8.8 is not added.",
    }),
  ),
};
const HttpsPorts = Type.Array(Type.Integer({ minimum: 1, maximum: 65535 }), {
  maxItems: 64,
  description: "Sandbox ports whose servers speak HTTPS: the daemon connects to them with TLS (unverified).",
});

/** E2B's SandboxNetworkConfig, as create takes it. */
export const NetworkConfig = Type.Object(
  {
    ...EgressFields,
    allowPublicTraffic: Type.Optional(
      Nullable(
        Type.Boolean({
          description:
            "false: requests to the sandbox's ports need E2B-Traffic-Access-Token. Default (absent or null) true.",
        }),
      ),
    ),
    maskRequestHost: Type.Optional(
      Type.String({
        maxLength: 300,
        description: `The Host header the sandbox's servers are sent; ${PORT_PLACEHOLDER} stands for the port.`,
      }),
    ),
    httpsPorts: Type.Optional(HttpsPorts),
  },
  open,
);

/** E2B's SandboxNetworkUpdateConfig: replaces the egress configuration (a field left out is cleared). */
export const NetworkUpdate = Type.Object(
  { allow_internet_access: Type.Optional(Type.Boolean()), ...EgressFields },
  open,
);

/** The network of a sandbox as SandboxDetail reports it (egress as it is now). */
export const NetworkInfo = Type.Object({
  allowOut: Type.Array(Type.String()),
  denyOut: Type.Array(Type.String()),
  allowPublicTraffic: Type.Boolean(),
  maskRequestHost: Type.Optional(Type.String()),
  httpsPorts: Type.Optional(Type.Array(Type.Integer())),
});

export const NewSandbox = Type.Object(
  {
    templateID: Type.String({ minLength: 1, maxLength: 256, description: "Template name or snapshot tag." }),
    timeout: Type.Optional(TimeoutSeconds),
    metadata: Type.Optional(StringMap("Metadata to find the sandbox by (list's metadata filter).")),
    envVars: Type.Optional(StringMap("Environment variables of every process and cell in the sandbox.")),
    secure: Type.Optional(Type.Boolean({ description: "v1 field; every sandbox is secured, as in E2B v2." })),
    allow_internet_access: Type.Optional(
      Type.Boolean({ description: 'false: the same as network.denyOut ["0.0.0.0/0"].' }),
    ),
    network: Type.Optional(NetworkConfig),
    autoPause: Type.Optional(Type.Boolean()),
    autoPauseMemory: Type.Optional(
      Type.Boolean({
        description:
          "false (with autoPause): the end of the lifetime pauses it without memory (filesystem only); not with autoResume (400).",
      }),
    ),
    autoResume: Type.Optional(Type.Object({ enabled: Type.Boolean() }, open)),
    mcp: Type.Optional(Nullable(Type.Object({}, open))),
    iam: Type.Optional(Type.Object({}, open)),
    volumeMounts: Type.Optional(Type.Array(Type.Object({ name: Type.String(), path: Type.String() }, open))),
  },
  { ...open, description: "NewSandboxV2 (and v1's NewSandbox)." },
);
export type NewSandbox = Static<typeof NewSandbox>;

export const Sandbox = Type.Object(
  {
    sandboxID: Type.String(),
    templateID: Type.String({ description: "The snapshot tag the sandbox was restored from." }),
    alias: Type.Optional(Type.String({ description: "The template name it was created by." })),
    clientID: Type.String({ description: "Deprecated E2B field: always `forkd`." }),
    envdVersion: Type.String(),
    envdAccessToken: Type.String(),
    trafficAccessToken: Type.String(),
    domain: Nullable(Type.String()),
  },
  { description: "A created, connected or forked sandbox: what the SDK needs to reach it." },
);

const SandboxSummary = {
  sandboxID: Type.String(),
  templateID: Type.String(),
  alias: Type.Optional(Type.String()),
  clientID: Type.String(),
  startedAt: Type.String({ format: "date-time" }),
  endAt: Type.String({ format: "date-time" }),
  cpuCount: Type.Integer(),
  memoryMB: Type.Integer(),
  diskSizeMB: Type.Integer(),
  envdVersion: Type.String(),
  metadata: StringMap("Metadata given at create."),
  state: Type.Union([Type.Literal("running"), Type.Literal("paused")]),
  volumeMounts: Type.Array(Type.Object({ name: Type.String(), path: Type.String() })),
};

export const ListedSandbox = Type.Object(SandboxSummary);

export const SandboxDetail = Type.Object({
  ...SandboxSummary,
  envdAccessToken: Type.String(),
  domain: Nullable(Type.String()),
  allowInternetAccess: Nullable(
    Type.Boolean({ description: "Whether destinations no rule names are reachable." }),
  ),
  network: NetworkInfo,
  lifecycle: Type.Object({
    onTimeout: Type.Union([Type.Literal("kill"), Type.Literal("pause")]),
    autoResume: Type.Boolean(),
  }),
});

export const ListSandboxesQuery = Type.Object({
  metadata: Type.Optional(
    Type.String({ maxLength: 16 * 1024, description: 'URL-encoded "key=value&key2=value2".' }),
  ),
  state: Type.Optional(
    Type.Union(
      [Type.String({ maxLength: 64 }), Type.Array(Type.String({ maxLength: 16 }), { maxItems: 4 })],
      {
        description: "running, paused, or both (comma separated or repeated).",
      },
    ),
  ),
  startedAfter: Type.Optional(Type.String({ maxLength: 64, description: "ISO 8601 date-time." })),
  template: Type.Optional(Type.String({ maxLength: 256 })),
  order: Type.Optional(Type.Union([Type.Literal("asc"), Type.Literal("desc")])),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_PAGE_LIMIT, default: DEFAULT_PAGE_LIMIT })),
  nextToken: Type.Optional(Type.String({ maxLength: 512 })),
});
export type ListSandboxesQuery = Static<typeof ListSandboxesQuery>;

export const ListSandboxesV1Query = Type.Object({
  metadata: Type.Optional(Type.String({ maxLength: 16 * 1024 })),
});

export const TimeoutBody = Type.Object({ timeout: TimeoutSeconds }, open);
export const RefreshBody = Type.Object({ duration: Type.Optional(TimeoutSeconds) }, open);
export const ConnectBody = Type.Object(
  {
    timeout: Type.Optional(TimeoutSeconds),
    memory: Type.Optional(
      Type.Boolean({
        description:
          "false (the SDKs' onResume 'reboot'): resume by a cold boot. A sandbox paused with memory: false always " +
          "resumes so (true is 400); one paused with memory refuses false (501). A running sandbox ignores it.",
      }),
    ),
  },
  open,
);
export const PauseBody = Type.Object(
  {
    memory: Type.Optional(
      Type.Boolean({
        description:
          "false: a filesystem-only pause: the guest's disk is synced and kept (with its id and tokens), its " +
          "processes and memory are not; connect resumes it by a cold boot, autoResume never does.",
      }),
    ),
    requireHealthyGuest: Type.Optional(
      Type.Boolean({
        description:
          "true: refuse the pause (503, the sandbox keeps running) when the guest agent does not answer a ping. " +
          "forkd's pause saves the VM whole, so it never needs the agent otherwise.",
      }),
    ),
  },
  open,
);
/** E2B's declared default lifetime of a sandbox resumed through the v1 resume route (ResumedSandbox.timeout). */
export const DEFAULT_RESUME_TIMEOUT_SECONDS = 15;
export const ResumeBody = Type.Object(
  {
    timeout: Type.Optional(TimeoutSeconds),
    memory: Type.Optional(
      Type.Boolean({ description: "As connect's: false resumes by a cold boot (see there)." }),
    ),
    autoPause: Type.Optional(Type.Boolean({ description: "Deprecated E2B field, ignored." })),
  },
  open,
);
export const ForkBody = Type.Object(
  {
    count: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_FORK_COUNT, default: 1 })),
    timeout: Type.Optional(TimeoutSeconds),
  },
  open,
);
export const ForkResult = Type.Object(
  { sandbox: Type.Optional(Sandbox), error: Type.Optional(ErrorBody) },
  { description: "One fork: its sandbox, or the error that kept it from starting." },
);

export const MetricsQuery = Type.Object({
  start: Type.Optional(Type.Integer({ minimum: 0 })),
  end: Type.Optional(Type.Integer({ minimum: 0 })),
});
export const SandboxMetric = Type.Object({
  timestamp: Type.String({ format: "date-time" }),
  timestampUnix: Type.Integer(),
  cpuCount: Type.Integer(),
  cpuUsedPct: Type.Number(),
  memUsed: Type.Integer(),
  memTotal: Type.Integer(),
  memCache: Type.Integer(),
  diskUsed: Type.Integer({ description: "Bytes in use on the sandbox's root filesystem (its statfs)." }),
  diskTotal: Type.Integer({ description: "Size of the sandbox's root filesystem." }),
});
export const ManyMetricsQuery = Type.Object({
  sandbox_ids: Type.Union([
    Type.String({ maxLength: 16 * 1024 }),
    Type.Array(Type.String(), { maxItems: 100 }),
  ]),
});
export const ManyMetrics = Type.Object({ sandboxes: Type.Record(Type.String(), SandboxMetric) });

export const SnapshotRequest = Type.Object(
  {
    name: Type.Optional(
      Type.String({
        pattern: TEMPLATE_ALIAS_PATTERN,
        description: "A template name for the snapshot; naming it again moves the name to the new one.",
      }),
    ),
    memory: Type.Optional(
      Type.Boolean({
        description: "false (a filesystem-only snapshot) is refused: 501; snapshots keep memory.",
      }),
    ),
  },
  open,
);
export const SnapshotInfo = Type.Object({
  snapshotID: Type.String({ description: "Usable as templateID: the snapshot's name, else its tag." }),
  names: Type.Array(Type.String()),
});
export const ListSnapshotsQuery = Type.Object({
  sandboxID: Type.Optional(Type.String({ maxLength: 128 })),
  name: Type.Optional(Type.String({ maxLength: 256 })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_PAGE_LIMIT, default: DEFAULT_PAGE_LIMIT })),
  nextToken: Type.Optional(Type.String({ maxLength: 512 })),
});

export const TemplateIdParams = Type.Object({ templateID: Type.String({ maxLength: 256 }) });
export const AliasParams = Type.Object({ alias: Type.String({ maxLength: 256 }) });
export const TemplateAliasResponse = Type.Object({ templateID: Type.String(), public: Type.Boolean() });
export const Template = Type.Object({
  templateID: Type.String(),
  buildID: Type.String(),
  buildStatus: Type.Literal("ready"),
  cpuCount: Type.Integer(),
  memoryMB: Type.Integer(),
  diskSizeMB: Type.Integer(),
  envdVersion: Type.String(),
  public: Type.Boolean(),
  aliases: Type.Array(Type.String()),
  names: Type.Array(Type.String()),
  createdAt: Type.String({ format: "date-time" }),
  updatedAt: Type.String({ format: "date-time" }),
  lastSpawnedAt: Nullable(Type.String({ format: "date-time" })),
  spawnCount: Type.Integer(),
  buildCount: Type.Integer(),
  createdBy: Type.Null(),
});
