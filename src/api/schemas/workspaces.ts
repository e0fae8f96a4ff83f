/** forkd v0.5 workspaces, kill-many and timeouts. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type Static, Type } from "@sinclair/typebox";
import { MAX_MEMORY_LIMIT_MIB, MAX_SANDBOX_TIMEOUT_MS, MIN_MEMORY_LIMIT_MIB } from "../../common/limits.js";
import { Nullable, Tag } from "./common.js";

// forkd v0.5 workspaces

export const WorkspaceNameParams = Type.Object(
  { name: Type.String({ maxLength: 64 }) },
  { additionalProperties: false },
);

export const WorkspaceInfoWire = Type.Object(
  {
    id: Type.String({ description: "ws-<sandbox id>." }),
    name: Type.String(),
    source_snapshot_tag: Type.String(),
    current_state_tag: Type.Optional(Type.String({ description: "The layer of its latest suspend." })),
    status: Type.Union([Type.Literal("running"), Type.Literal("suspended"), Type.Literal("stale")], {
      description: "stale: its sandbox is gone (a host reboot while it ran); resume starts it again.",
    }),
    live_sandbox_id: Type.Optional(
      Type.String({ description: "Its sandbox while running: the same id across suspends (unlike v0.5)." }),
    ),
    created_at_unix: Type.Integer(),
    last_active_unix: Type.Integer(),
    last_branch_memory_path: Type.Optional(
      Type.String({ description: "The memory file of its latest suspend's layer (memory.layer)." }),
    ),
  },
  { description: "forkd v0.5's WorkspaceInfo." },
);
export type WorkspaceInfoWire = Static<typeof WorkspaceInfoWire>;

export const CreateWorkspaceBody = Type.Object(
  {
    name: Type.String({ description: "1-64 characters: ASCII letters, digits, '-', '_'." }),
    snapshot_tag: Tag,
    per_child_netns: Type.Optional(
      Type.Boolean({ description: "v0.5 field: every sandbox with a network has its own namespace." }),
    ),
    memory_limit_mib: Type.Optional(
      Nullable(Type.Integer({ minimum: MIN_MEMORY_LIMIT_MIB, maximum: MAX_MEMORY_LIMIT_MIB })),
    ),
  },
  { additionalProperties: false },
);

export const SuspendWorkspaceBody = Type.Object(
  {
    diff: Type.Optional(
      Type.Boolean({
        description:
          "v0.5's flag. true: a layer over the previous suspend's (merged automatically when that stops paying); " +
          "false (default): one layer holding everything since the workspace's snapshot.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const KillManyQuery = Type.Object(
  {
    all: Type.Optional(Type.Boolean({ description: "Kill every sandbox (required without snapshot_tag)." })),
    snapshot_tag: Type.Optional(Tag),
  },
  { additionalProperties: false },
);
export const KillManyResponse = Type.Object({ killed: Type.Array(Type.String()) });

export const SetTimeoutBody = Type.Object(
  {
    timeout_ms: Type.Integer({
      minimum: 0,
      maximum: MAX_SANDBOX_TIMEOUT_MS,
      description: "Remaining lifetime from now, in ms; 0 = no limit.",
    }),
  },
  { additionalProperties: false },
);
