/** /v1/template-aliases: names for snapshot tags (the E2B API resolves template names through them). */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { servicesOf } from "../../http/request-scope.js";
import { AliasParams, errorResponses, SetAliasBody, TemplateAliasWire } from "../schemas.js";

type AliasRequest = { Params: Static<typeof AliasParams> };

export function registerTemplateAliasRoutes(app: FastifyInstance): void {
  app.get(
    "/v1/template-aliases",
    {
      schema: {
        tags: ["snapshots"],
        summary: "List template aliases",
        response: { 200: Type.Array(TemplateAliasWire), ...errorResponses },
      },
    },
    async (request) => servicesOf(request).snapshots.aliases.list(),
  );

  app.get<AliasRequest>(
    "/v1/template-aliases/:alias",
    {
      schema: {
        tags: ["snapshots"],
        summary: "One template alias",
        params: AliasParams,
        response: { 200: TemplateAliasWire, ...errorResponses },
      },
    },
    async (request) => servicesOf(request).snapshots.aliases.get(request.params.alias),
  );

  app.put<AliasRequest & { Body: Static<typeof SetAliasBody> }>(
    "/v1/template-aliases/:alias",
    {
      schema: {
        tags: ["snapshots"],
        summary: "Point an alias at a snapshot tag (creating or replacing it)",
        description:
          "404 when the snapshot does not exist. A template name that is an alias wins over a tag.",
        params: AliasParams,
        body: SetAliasBody,
        response: { 200: TemplateAliasWire, ...errorResponses },
      },
    },
    async (request) => {
      const row = await servicesOf(request).snapshots.aliases.set(request.params.alias, request.body.tag);
      request.auditIds.push(row.tag);
      return row;
    },
  );

  app.delete<AliasRequest>(
    "/v1/template-aliases/:alias",
    {
      schema: {
        tags: ["snapshots"],
        summary: "Remove an alias (the snapshot stays)",
        params: AliasParams,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      await servicesOf(request).snapshots.aliases.delete(request.params.alias);
      return reply.status(204).send();
    },
  );
}
