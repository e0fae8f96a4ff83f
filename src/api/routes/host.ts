/**
 * What the host and its sandboxes use, measured on the host: `GET /v1/host` (CPUs, load, memory, sandboxes by
 * status), `GET /v1/usage` (every running sandbox's memory and CPU) and `GET /v1/sandboxes/:id/usage`.
 */
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { ForkdError } from "../../common/errors.js";
import type { ApiContext } from "../context.js";
import {
  errorResponses,
  HostStatusWire,
  SandboxParams,
  SandboxUsageWire,
  UsageQuery,
  UsageResponse,
} from "../schemas.js";

export function registerHostRoutes(app: FastifyInstance, context: ApiContext): void {
  const { sandboxes } = context.services;

  app.get(
    "/v1/host",
    {
      schema: {
        tags: ["status"],
        summary: "The host: CPUs, load, memory, sandboxes by status",
        response: { 200: HostStatusWire, ...errorResponses },
      },
    },
    async () => sandboxes.host(),
  );

  app.get<{ Querystring: Static<typeof UsageQuery> }>(
    "/v1/usage",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Memory (RSS, PSS, private) and CPU of running sandboxes, measured on the host",
        description:
          "One entry per running sandbox (or per id asked for that is running; others are left out). Reads each " +
          "VM's /proc/<pid>/smaps_rollup and stat: nothing is asked of the guests.",
        querystring: UsageQuery,
        response: { 200: UsageResponse, ...errorResponses },
      },
    },
    async (request) => {
      const id = request.query.id;
      const ids = id === undefined ? undefined : Array.isArray(id) ? id : [id];
      return { sandboxes: await sandboxes.usage(ids === undefined ? {} : { ids }) };
    },
  );

  app.get<{ Params: Static<typeof SandboxParams> }>(
    "/v1/sandboxes/:id/usage",
    {
      schema: {
        tags: ["sandboxes"],
        summary: "Memory (RSS, PSS, private) and CPU of one sandbox, measured on the host",
        description: "409 when the sandbox is not running.",
        params: SandboxParams,
        response: { 200: SandboxUsageWire, ...errorResponses },
      },
    },
    async (request) => {
      const info = sandboxes.get(request.params.id);
      const [usage] = await sandboxes.usage({ ids: [info.id] });
      if (!usage) throw new ForkdError("conflict", `sandbox ${info.id} is ${info.status}: no VM to measure`);
      return usage;
    },
  );
}
