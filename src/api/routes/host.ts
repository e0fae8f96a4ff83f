/**
 * What the host and its sandboxes use, measured on the host: `GET /v1/host` (CPUs, load, memory, sandboxes by
 * status; an admin's), `GET /v1/usage` (every running sandbox's memory and CPU: the caller's) and
 * `GET /v1/sandboxes/:id/usage`, all through the caller's view of the services.
 */
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { ForkdError } from "../../common/errors.js";
import { servicesOf } from "../../http/request-scope.js";
import {
  errorResponses,
  HostStatusWire,
  SandboxParams,
  SandboxUsageWire,
  UsageQuery,
  UsageResponse,
} from "../schemas.js";

export function registerHostRoutes(app: FastifyInstance): void {
  app.get(
    "/v1/host",
    {
      schema: {
        tags: ["status"],
        summary: "The host: CPUs, load, memory, sandboxes by status",
        description:
          "For admins: 403 for a tenant's token (the counts and load describe every tenant's sandboxes).",
        response: { 200: HostStatusWire, ...errorResponses },
      },
    },
    async (request) => servicesOf(request).sandboxes.host(),
  );

  app.get<{ Querystring: Static<typeof UsageQuery> }>(
    "/v1/usage",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Memory (RSS, PSS, private) and CPU of running sandboxes, measured on the host",
        description:
          "One entry per running sandbox (or per id asked for that is running; others are left out; a tenant's " +
          "token sees its own sandboxes only). Reads each VM's /proc/<pid>/smaps_rollup and stat: nothing is " +
          "asked of the guests.",
        querystring: UsageQuery,
        response: { 200: UsageResponse, ...errorResponses },
      },
    },
    async (request) => {
      const id = request.query.id;
      const ids = id === undefined ? undefined : Array.isArray(id) ? id : [id];
      return { sandboxes: await servicesOf(request).sandboxes.usage(ids === undefined ? {} : { ids }) };
    },
  );

  app.get<{ Params: Static<typeof SandboxParams> }>(
    "/v1/sandboxes/:id/usage",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Memory (RSS, PSS, private) and CPU of one sandbox, measured on the host",
        description: "409 when the sandbox is not running; 404 for another tenant's, as for an unknown id.",
        params: SandboxParams,
        response: { 200: SandboxUsageWire, ...errorResponses },
      },
    },
    async (request) => {
      const { sandboxes } = servicesOf(request);
      const info = sandboxes.get(request.params.id);
      const [usage] = await sandboxes.usage({ ids: [info.id] });
      if (!usage) throw new ForkdError("conflict", `sandbox ${info.id} is ${info.status}: no VM to measure`);
      return usage;
    },
  );
}
