/**
 * E2B's template build routes as the SDKs' Template.build calls them: request a build (POST /v3/templates), start
 * it with its steps (POST /v2/templates/{templateID}/builds/{buildID}), poll its status with the log from an
 * offset; the build logs route and the template with its builds (GET /templates/{templateID}).
 */
import { type Static, Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { invalidArgument } from "../../common/errors.js";
import { servicesOf } from "../../http/request-scope.js";
import { errorResponses, TemplateIdParams } from "../control/schemas.js";
import {
  BuildInfo,
  BuildLogs,
  BuildParams,
  BuildRequestResponseV3,
  BuildRequestV3,
  BuildStartV2,
  LogsQuery,
  StatusQuery,
  TemplateWithBuilds,
} from "./schemas.js";
import { recipeOf } from "./translate.js";
import { buildsOf, logToWire, namesOf, templateToWire } from "./wire.js";

type Params = Static<typeof BuildParams>;

export function registerBuildRoutes(app: FastifyInstance): void {
  registerCreate(app);
  registerStart(app);
  registerStatus(app);
  registerLogs(app);
  registerTemplate(app);
}

/** POST /v3/templates: a template (or a new build of one) and its build id. */
function registerCreate(app: FastifyInstance): void {
  app.post<{ Body: Static<typeof BuildRequestV3> }>(
    "/v3/templates",
    {
      schema: {
        summary: "Request a template build (Template.build's first call)",
        description:
          "Makes the caller's template `name` if it is new and a build of it waiting for its steps. A name another " +
          "tenant's template or alias holds is 409. cpuCount and memoryMB are every sandbox's; minFreeDiskMb sizes the disk.",
        body: BuildRequestV3,
        response: { 202: BuildRequestResponseV3, ...errorResponses },
      },
    },
    async (request, reply) => {
      const body = request.body;
      const name = body.name ?? body.alias;
      if (!name) throw invalidArgument("name is required");
      const { template, build } = await buildsOf(servicesOf(request)).request({
        name,
        tags: body.tags ?? [],
        cpuCount: body.cpuCount,
        memoryMiB: body.memoryMB,
        minFreeDiskMiB: body.minFreeDiskMb,
      });
      request.auditIds.push(template.id);
      return reply.status(202).send({
        templateID: template.id,
        buildID: build.id,
        public: false,
        names: namesOf(template),
        tags: build.tags,
        aliases: [template.name],
      });
    },
  );
}

/** POST /v2/templates/:templateID/builds/:buildID: the build's steps, run in the background. */
function registerStart(app: FastifyInstance): void {
  app.post<{ Params: Params; Body: Static<typeof BuildStartV2> }>(
    "/v2/templates/:templateID/builds/:buildID",
    {
      schema: {
        summary: "Start a build with its base, steps, start and ready commands",
        description:
          "Each E2B step becomes a format-2 build step (docs/e2b.md); COPY steps take the archives uploaded under " +
          "their filesHash. 202 once accepted: the build runs in the background.",
        params: BuildParams,
        body: BuildStartV2,
        response: { 202: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      const builds = buildsOf(servicesOf(request));
      const { templateID, buildID } = request.params;
      // The template first: an unknown (or another tenant's) one is 404 whatever the body says.
      await builds.get(templateID);
      const base = request.body.fromTemplate ? await builds.recipe(request.body.fromTemplate) : undefined;
      await builds.start(templateID, buildID, recipeOf(request.body, base));
      request.auditIds.push(templateID);
      return reply.status(202).send();
    },
  );
}

/** A build's status with its log from an offset. */
function registerStatus(app: FastifyInstance): void {
  app.get<{ Params: Params; Querystring: Static<typeof StatusQuery> }>(
    "/templates/:templateID/builds/:buildID/status",
    {
      schema: {
        summary: "A build's status and its log from logsOffset on",
        params: BuildParams,
        querystring: StatusQuery,
        response: { 200: BuildInfo, ...errorResponses },
      },
    },
    async (request) => {
      const { templateID, buildID } = request.params;
      const { build, logs } = await buildsOf(servicesOf(request)).status(templateID, buildID, {
        logsOffset: request.query.logsOffset,
        limit: request.query.limit,
      });
      const entries = logs
        .filter((l) => !request.query.level || l.level === request.query.level)
        .map(logToWire);
      return {
        templateID,
        buildID: build.id,
        status: build.status,
        logs: [],
        logEntries: entries,
        ...(build.reason
          ? {
              reason: {
                message: build.reason.message,
                ...(build.reason.step === undefined ? {} : { step: build.reason.step }),
                logEntries: entries.filter((e) => e.level === "error"),
              },
            }
          : {}),
      };
    },
  );
}

/** A build's log. */
function registerLogs(app: FastifyInstance): void {
  app.get<{ Params: Params; Querystring: Static<typeof LogsQuery> }>(
    "/templates/:templateID/builds/:buildID/logs",
    {
      schema: {
        summary: "A build's log (cursor: entries to skip)",
        params: BuildParams,
        querystring: LogsQuery,
        response: { 200: BuildLogs, ...errorResponses },
      },
    },
    async (request) => {
      const { templateID, buildID } = request.params;
      const { logs } = await buildsOf(servicesOf(request)).status(templateID, buildID, {
        logsOffset: request.query.cursor,
        limit: request.query.limit,
      });
      return {
        logs: logs.filter((l) => !request.query.level || l.level === request.query.level).map(logToWire),
      };
    },
  );
}

/** A template with its builds. */
function registerTemplate(app: FastifyInstance): void {
  app.get<{ Params: { templateID: string } }>(
    "/templates/:templateID",
    {
      schema: {
        summary: "A template built through this API, with its builds",
        params: TemplateIdParams,
        response: { 200: TemplateWithBuilds, ...errorResponses },
      },
    },
    async (request) => {
      const builds = buildsOf(servicesOf(request));
      const template = await builds.get(request.params.templateID);
      return templateToWire(template, await builds.builds(template.id));
    },
  );
}
