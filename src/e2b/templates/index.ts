/**
 * E2B's template build API (Template.build in both SDKs, the `e2b template` CLI): every route on the control
 * plane's scope (its API key check, error body and OpenAPI record), served by the daemon's template builds
 * (src/controller/builds) through the caller's view.
 */
import type { FastifyInstance } from "fastify";
import { registerBuildRoutes } from "./builds.js";
import { registerFileRoutes } from "./files.js";
import { registerTagRoutes } from "./tags.js";

export async function registerTemplateBuildRoutes(app: FastifyInstance): Promise<void> {
  registerBuildRoutes(app);
  registerTagRoutes(app);
  await registerFileRoutes(app);
}
