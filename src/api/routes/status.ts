/** Health, version, Prometheus metrics and the OpenAPI document. */
import type { FastifyInstance } from "fastify";
import { ForkdError } from "../../common/errors.js";
import { FORKD_VERSION } from "../../common/version.js";
import type { ApiContext } from "../context.js";
import { errorResponses, HealthResponse, VersionResponse } from "../schemas.js";

export function registerStatusRoutes(app: FastifyInstance, context: ApiContext): void {
  app.get(
    "/healthz",
    {
      schema: {
        tags: ["status"],
        summary: "Liveness; never needs a token",
        security: [],
        response: { 200: HealthResponse },
      },
    },
    async () => ({ ok: true as const }),
  );

  app.get(
    "/version",
    {
      schema: {
        tags: ["status"],
        summary: "Daemon version",
        response: { 200: VersionResponse, ...errorResponses },
      },
    },
    async () => ({ version: FORKD_VERSION, api: "v1" as const }),
  );

  app.get(
    "/metrics",
    {
      schema: {
        tags: ["status"],
        summary: "Prometheus text exposition",
        description: "For admins: 403 for a tenant's token (the series name every tenant's sandboxes).",
        produces: ["text/plain"],
        response: { 200: { type: "string", description: "Prometheus text format 0.0.4" }, ...errorResponses },
      },
    },
    async (request, reply) => {
      // Its series name every sandbox and snapshot of the daemon, whoever owns them.
      if (request.principal?.tenant != null) {
        throw new ForkdError("forbidden", "/metrics is for admins: it describes every tenant's sandboxes");
      }
      const text = await context.metrics.registry.metrics();
      return reply.type(context.metrics.registry.contentType).send(text);
    },
  );

  app.get(
    "/openapi.json",
    {
      schema: {
        tags: ["status"],
        summary: "This API's OpenAPI document",
        response: { 200: { type: "object", additionalProperties: true }, ...errorResponses },
      },
    },
    async () => app.swagger(),
  );
}
