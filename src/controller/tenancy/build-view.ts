/**
 * Template builds as one tenant may use them: every call acts as that tenant (its templates, its uploads; what
 * it builds is its own), whatever owner the caller passed. Another tenant's template is an unknown one (404).
 */
import type { TemplateBuildService } from "../builds/contract.js";

export function tenantBuilds(inner: TemplateBuildService, tenant: string): TemplateBuildService {
  return {
    request: (request) => inner.request({ ...request, owner: tenant }),
    hasFiles: (hash) => inner.hasFiles(hash, tenant),
    putFiles: (hash, body) => inner.putFiles(hash, body, tenant),
    start: (templateId, buildId, recipe) => inner.start(templateId, buildId, recipe, tenant),
    status: (templateId, buildId, options) =>
      inner.status(templateId, buildId, { ...options, owner: tenant }),
    recipe: (idOrName) => inner.recipe(idOrName, tenant),
    get: (idOrName) => inner.get(idOrName, tenant),
    builds: (templateId) => inner.builds(templateId, tenant),
    list: () => inner.list(tenant),
    assignTags: (target, tags) => inner.assignTags(target, tags, tenant),
    removeTags: (name, tags) => inner.removeTags(name, tags, tenant),
    delete: (idOrName) => inner.delete(idOrName, tenant),
  };
}
