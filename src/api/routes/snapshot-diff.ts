/** `POST /v1/snapshots/:tag/diff`: a new layer on a snapshot, made by running a command (forkd snapshot-diff). */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import { BranchResultWire, errorResponses, Tag } from "../schemas.js";
import { branchToWire } from "../wire.js";

const DiffParams = Type.Object({ tag: Tag }, { additionalProperties: false });
const DiffBody = Type.Object(
  {
    tag: Tag,
    exec: Type.Union([
      Type.String({
        minLength: 1,
        maxLength: 60_000,
        description: "Shell command, run with /bin/sh -c in the sandbox.",
      }),
      Type.Array(Type.String({ maxLength: 60_000 }), {
        minItems: 1,
        maxItems: 4096,
        description: "argv, no shell.",
      }),
    ]),
    timeout_ms: Type.Optional(Type.Integer({ minimum: 1, maximum: 24 * 3_600_000 })),
  },
  { additionalProperties: false },
);
const DiffResultWire = Type.Composite([
  BranchResultWire,
  Type.Object({ exit_code: Type.Integer(), stdout: Type.String(), stderr: Type.String() }),
]);

export function registerSnapshotDiffRoutes(app: FastifyInstance, context: ApiContext): void {
  app.post<{ Params: Static<typeof DiffParams>; Body: Static<typeof DiffBody> }>(
    "/v1/snapshots/:tag/diff",
    {
      schema: {
        tags: ["snapshots"],
        summary: "Layer a new snapshot on :tag by running a command (snapshot-diff)",
        description:
          "Spawns a sandbox from :tag, runs exec (a non-zero exit or a timeout answers 422 with the output), " +
          "BRANCHes it in diff mode as tag (parent :tag), kills the sandbox. 201 with the new snapshot.",
        params: DiffParams,
        body: DiffBody,
        response: { 201: DiffResultWire, ...errorResponses },
      },
    },
    async (request, reply) => {
      const { exec } = request.body;
      const outcome = await servicesOf(request).sandboxes.snapshotDiff({
        from: request.params.tag,
        tag: request.body.tag,
        command: typeof exec === "string" ? ["/bin/sh", "-c", exec] : exec,
        timeoutMs: request.body.timeout_ms,
        signal: clientSignal(request, reply),
      });
      request.auditIds.push(outcome.tag);
      return reply.status(201).send({
        ...branchToWire(outcome, "snapshot-diff", context.snapshotsDir, { measure: false }),
        exit_code: outcome.exit_code,
        stdout: outcome.stdout,
        stderr: outcome.stderr,
      });
    },
  );
}
