/** Calls into the guest: ping, exec, eval, branch. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type Static, Type } from "@sinclair/typebox";
import {
  ENV_NAME_PATTERN,
  MAX_EVAL_CODE_CHARS,
  MAX_EXEC_ARG_CHARS,
  MAX_EXEC_ARGS,
  MAX_PATH_CHARS,
  TEMPLATE_ALIAS_PATTERN,
} from "../../common/limits.js";
import { Nullable, Tag, TimeoutMs, TimeoutSecs } from "./common.js";
import { SnapshotInfoWire } from "./snapshots.js";

export const PingResponse = Type.Object({
  pong: Type.Literal(true),
  protocol: Type.Integer(),
  agent_version: Type.String(),
  template: Type.String(),
  interpreter: Type.String(),
  warm: Type.Unknown(),
  sandbox_id: Nullable(Type.String()),
  hostname: Type.String(),
  uptime_ms: Type.Number(),
});

export const ExecCommon = {
  args: Type.Array(Type.String({ maxLength: MAX_EXEC_ARG_CHARS }), {
    minItems: 1,
    maxItems: MAX_EXEC_ARGS,
    description: "argv; args[0] is looked up in PATH. No shell is involved.",
  }),
  timeout_secs: Type.Optional(TimeoutSecs),
  timeout_ms: Type.Optional(TimeoutMs),
  env: Type.Optional(
    Type.Record(Type.String({ pattern: ENV_NAME_PATTERN }), Type.String(), {
      additionalProperties: false,
      description: "Environment variables added to the guest's; names are [A-Za-z_][A-Za-z0-9_]*.",
    }),
  ),
  cwd: Type.Optional(Type.String({ minLength: 1, maxLength: MAX_PATH_CHARS, description: "Absolute." })),
  encoding: Type.Optional(
    Type.Union([Type.Literal("utf8"), Type.Literal("base64")], {
      description: "How stdout/stderr bytes are put in JSON strings (default utf8, invalid bytes replaced).",
    }),
  ),
};

export const ExecBody = Type.Object(
  {
    ...ExecCommon,
    stdin: Type.Optional(Type.String({ description: "Text written to the process's stdin, then EOF." })),
    stdin_b64: Type.Optional(Type.String({ description: "Like stdin, base64. Not both." })),
  },
  { additionalProperties: false },
);
export type ExecBody = Static<typeof ExecBody>;

export const ExecResponse = Type.Object({
  stdout: Type.String(),
  stderr: Type.String(),
  exit_code: Type.Integer({
    description: "The exit status; 128+N when killed by signal N (v0.5: always set).",
  }),
  signal: Nullable(Type.String()),
  timed_out: Type.Boolean(),
  stdout_truncated: Type.Boolean(),
  stderr_truncated: Type.Boolean(),
  duration_ms: Type.Number(),
  encoding: Type.Union([Type.Literal("utf8"), Type.Literal("base64")]),
});

export const EvalBody = Type.Object(
  {
    code: Type.String({ maxLength: MAX_EVAL_CODE_CHARS }),
    timeout_ms: Type.Optional(TimeoutMs),
    timeout_secs: Type.Optional(TimeoutSecs),
  },
  { additionalProperties: false },
);
export type EvalBody = Static<typeof EvalBody>;

export const EvalResponse = Type.Object({
  result: Nullable(Type.String({ description: "repr() of the trailing expression, or null." })),
  error: Nullable(Type.String({ description: "'Type: message' of an uncaught exception, or null." })),
  exit_code: Type.Integer({ description: "0 without an error, 1 with one (v0.5 shape)." }),
  error_type: Nullable(Type.String()),
  traceback: Nullable(Type.String()),
  stdout: Type.String(),
  stderr: Type.String(),
  timed_out: Type.Boolean(),
  result_truncated: Type.Boolean(),
  stdout_truncated: Type.Boolean(),
  stderr_truncated: Type.Boolean(),
  duration_ms: Type.Number(),
});

export const BranchResultWire = Type.Composite(
  [
    SnapshotInfoWire,
    Type.Object({
      branched_from: Type.String({ description: "The source sandbox (v0.5 field)." }),
      mode: Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")]),
      pause_ms: Type.Integer({ description: "How long the source was paused, whole ms (v0.5 field)." }),
      bytes_captured: Type.Integer({ description: "Guest RAM captured: the pages the source had changed." }),
      bytes_written: Type.Integer({
        description: "Bytes written for the new snapshot (memory, device state, disk layer).",
      }),
      diff_ms: Type.Optional(
        Type.Integer({
          description:
            "v0.5 field, with measure_diff or mode diff: ms spent finding and copying the pages the source " +
            "changed (inside the pause for full and diff, in the background for live; 0 with wait: false).",
        }),
      ),
      diff_physical_bytes: Type.Optional(
        Type.Integer({ description: "v0.5 field, with measure_diff or mode diff: bytes of those pages." }),
      ),
      diff_logical_bytes: Type.Optional(
        Type.Integer({ description: "v0.5 field, with measure_diff or mode diff: the guest's RAM size." }),
      ),
    }),
  ],
  { description: "The new snapshot (SnapshotInfo) plus what the BRANCH cost." },
);
export type BranchResultWire = Static<typeof BranchResultWire>;

export const BranchBody = Type.Object(
  {
    tag: Type.Optional(Tag),
    mode: Type.Optional(Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")])),
    diff: Type.Optional(Type.Boolean({ description: "Legacy form of mode=diff." })),
    live: Type.Optional(Type.Boolean({ description: "Legacy form of mode=live." })),
    measure_diff: Type.Optional(Type.Boolean()),
    parent_tag: Type.Optional(Tag),
    wait: Type.Optional(Type.Boolean()),
    alias: Type.Optional(
      Type.String({
        pattern: TEMPLATE_ALIAS_PATTERN,
        description:
          "Also point this template alias at the new snapshot (the one it named before is deleted once unused).",
      }),
    ),
  },
  { additionalProperties: false },
);

// ---------------------------------------------------------------------------------------------------------------
