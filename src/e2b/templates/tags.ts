/** Template tags (`name:tag`) as the SDKs' assignTags / removeTags / getTags call them. */
import { type Static, Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { servicesOf } from "../../http/request-scope.js";
import { errorResponses, TemplateIdParams } from "../control/schemas.js";
import { AssignedTags, AssignTags, DeleteTags, TemplateTagList } from "./schemas.js";
import { buildsOf } from "./wire.js";

export function registerTagRoutes(app: FastifyInstance): void {
  app.post<{ Body: Static<typeof AssignTags> }>(
    "/templates/tags",
    {
      schema: {
        summary: "Point tags at the build `target` (name:tag, or name for its newest ready build) names",
        body: AssignTags,
        response: { 201: AssignedTags, ...errorResponses },
      },
    },
    async (request, reply) => {
      const done = await buildsOf(servicesOf(request)).assignTags(request.body.target, request.body.tags);
      return reply.status(201).send({ tags: done.tags, buildID: done.buildId });
    },
  );

  app.delete<{ Body: Static<typeof DeleteTags> }>(
    "/templates/tags",
    {
      schema: {
        summary: "Remove tags of a template (their name:tag names go)",
        body: DeleteTags,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      await buildsOf(servicesOf(request)).removeTags(request.body.name, request.body.tags);
      return reply.status(204).send();
    },
  );

  app.get<{ Params: { templateID: string } }>(
    "/templates/:templateID/tags",
    {
      schema: {
        summary: "The tags of a template and the builds they name",
        params: TemplateIdParams,
        response: { 200: TemplateTagList, ...errorResponses },
      },
    },
    async (request) => {
      const template = await buildsOf(servicesOf(request)).get(request.params.templateID);
      return Object.entries(template.tags).map(([tag, t]) => ({
        tag,
        buildID: t.buildId,
        createdAt: t.assignedAt,
      }));
    },
  );
}
