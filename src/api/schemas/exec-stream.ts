/** Streaming exec (NDJSON events). Part of the REST API's wire contract (src/api/schemas.ts). */
import { Type } from "@sinclair/typebox";
import { Nullable } from "./common.js";

// Streaming exec (NDJSON)

export const ExecStreamEvent = Type.Union(
  [
    Type.Object({ type: Type.Literal("started"), id: Type.String() }),
    Type.Object({
      type: Type.Union([Type.Literal("stdout"), Type.Literal("stderr")]),
      data: Type.String({ description: "A chunk, in the request's encoding." }),
    }),
    Type.Object({
      type: Type.Literal("exit"),
      exit_code: Type.Integer(),
      signal: Nullable(Type.String()),
      timed_out: Type.Boolean(),
      stdout_bytes: Type.Integer(),
      stderr_bytes: Type.Integer(),
      duration_ms: Type.Number(),
    }),
    Type.Object({ type: Type.Literal("error"), error: Type.String(), code: Type.String() }),
  ],
  { description: "One line of the application/x-ndjson response of exec/stream." },
);
