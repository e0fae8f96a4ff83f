/**
 * Template names on the E2B API: an alias or a snapshot tag (the controller resolves both), and E2B's default
 * template names, which mean the daemon's default snapshot so `Sandbox.create()` works without an argument.
 * Routes: the alias check the SDK's Template.exists() calls, the template list, and template deletion (how the
 * SDK deletes a snapshot).
 */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { notFound } from "../../common/errors.js";
import { TEMPLATE_ALIAS_PATTERN } from "../../common/limits.js";
import type { SnapshotInfo } from "../../controller/sandbox-service.js";
import type { ResolvedTemplate } from "../../controller/snapshots/template-aliases.js";
import type { Services } from "../../controller/tenancy/tenant-view.js";
import { servicesOf } from "../../http/request-scope.js";
import type { E2bContext } from "../context.js";
import { ENVD_VERSION } from "../envd/version.js";
import { AliasParams, errorResponses, Template, TemplateAliasResponse, TemplateIdParams } from "./schemas.js";

/**
 * The template names the installed SDKs create sandboxes from when given none: `base` (e2b), and
 * `code-interpreter-v1` (@e2b/code-interpreter). An explicit alias of the same name wins.
 */
export const E2B_DEFAULT_TEMPLATES: ReadonlySet<string> = new Set(["base", "code-interpreter-v1"]);

const TEMPLATE_NAME = new RegExp(TEMPLATE_ALIAS_PATTERN);

/** A template name to a snapshot tag; 404 (E2B's answer for an unknown template) when it names nothing. */
export async function resolveTemplateName(
  services: Services,
  name: string,
  allowDefault = true,
): Promise<ResolvedTemplate> {
  if (!TEMPLATE_NAME.test(name)) throw notFound(`template ${JSON.stringify(name)} not found`);
  return services.snapshots.resolveTemplate(name, {
    orDefault: allowDefault && E2B_DEFAULT_TEMPLATES.has(name),
  });
}

export function registerTemplateRoutes(app: FastifyInstance, context: E2bContext): void {
  app.get<{ Params: Static<typeof AliasParams> }>(
    "/templates/aliases/:alias",
    {
      schema: {
        summary: "Whether a template name exists (the SDK's Template.exists)",
        params: AliasParams,
        response: { 200: TemplateAliasResponse, ...errorResponses },
      },
    },
    async (request) => {
      const services = servicesOf(request);
      const resolved = await resolveTemplateName(services, request.params.alias);
      // A template built through the template API answers with its own id (the one its builds name).
      const built = await services.builds?.get(request.params.alias).catch(() => undefined);
      return { templateID: built?.id ?? resolved.tag, public: false };
    },
  );

  app.get(
    "/templates",
    {
      schema: {
        summary: "Templates: the daemon's bootable snapshots",
        response: { 200: Type.Array(Template), ...errorResponses },
      },
    },
    async (request) => {
      const { snapshots } = servicesOf(request);
      const all = (await snapshots.list()).filter((s) => s.status === "ready" && s.bootable && !s.ephemeral);
      return Promise.all(all.map(async (s) => templateToWire(s, await context.facts.of(snapshots, s.tag))));
    },
  );

  app.delete<{ Params: Static<typeof TemplateIdParams> }>(
    "/templates/:templateID",
    {
      schema: {
        summary: "Delete a template or snapshot (by name or tag) and the aliases naming it",
        description:
          "404 unknown. The names go at once; the snapshot too, or, while a sandbox runs on it (the sandbox it " +
          "was taken of does) or another snapshot depends on it, as soon as nothing does.",
        params: TemplateIdParams,
        response: { 204: Type.Null(), ...errorResponses },
      },
    },
    async (request, reply) => {
      const services = servicesOf(request);
      // A template built through the template API goes whole: its builds, names and snapshots.
      const built = await services.builds?.get(request.params.templateID).catch(() => undefined);
      if (built && services.builds) {
        await services.builds.delete(built.id);
        request.auditIds.push(built.id);
        return reply.status(204).send();
      }
      const resolved = await resolveTemplateName(services, request.params.templateID, false);
      await services.snapshots.retire(resolved.tag);
      request.auditIds.push(resolved.tag);
      return reply.status(204).send();
    },
  );
}

function templateToWire(
  s: SnapshotInfo,
  facts: { cpuCount: number; memoryMB: number; diskSizeMB: number },
): Static<typeof Template> {
  const at = new Date(s.created_at_unix * 1000).toISOString();
  return {
    templateID: s.tag,
    buildID: s.tag,
    buildStatus: "ready",
    cpuCount: facts.cpuCount,
    memoryMB: facts.memoryMB,
    diskSizeMB: facts.diskSizeMB,
    envdVersion: ENVD_VERSION,
    public: false,
    aliases: s.aliases,
    names: [s.tag, ...s.aliases],
    createdAt: at,
    updatedAt: at,
    lastSpawnedAt: null,
    spawnCount: 0,
    buildCount: 1,
    createdBy: null,
  };
}
