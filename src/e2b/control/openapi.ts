/**
 * The E2B OpenAPI document: E2B's REST API as forkd serves it, generated from the routes the control plane
 * registered (their TypeBox schemas are the ones that validate requests). docs/e2b-openapi.json is this output,
 * checked in (`npm run openapi` rewrites it; a test fails when it is stale). The data plane (envd's Connect
 * services and /files, the code interpreter) is not REST and is described in docs/e2b.md.
 */
import type { RouteOptions } from "fastify";
import { FORKD_VERSION } from "../../common/version.js";

type Json = Record<string, unknown>;

/** A TypeBox schema as plain JSON Schema (TypeBox's own markers are symbols, dropped by the round trip). */
function plain(schema: unknown): Json {
  return JSON.parse(JSON.stringify(schema)) as Json;
}

/** A body schema that also allows no body (OptionalBody): the schema without its `undefined` member. */
function unwrapOptional(schema: Json): { schema: Json; required: boolean } {
  const anyOf = schema.anyOf as Json[] | undefined;
  if (anyOf?.some((s) => s.type === "undefined")) {
    const rest = anyOf.filter((s) => s.type !== "undefined");
    return { schema: rest.length === 1 ? (rest[0] as Json) : { anyOf: rest }, required: false };
  }
  return { schema, required: true };
}

function parameters(where: "path" | "query", schema: unknown): Json[] {
  if (schema === undefined) return [];
  const s = plain(schema);
  const required = new Set((s.required as string[] | undefined) ?? []);
  return Object.entries((s.properties as Record<string, Json> | undefined) ?? {}).map(([name, prop]) => ({
    name,
    in: where,
    required: where === "path" || required.has(name),
    ...(typeof prop.description === "string" ? { description: prop.description } : {}),
    schema: prop,
  }));
}

function responses(schema: Record<string, unknown> | undefined): Json {
  const out: Json = {};
  for (const [status, body] of Object.entries(schema ?? {})) {
    const s = plain(body);
    out[status] =
      s.type === "null"
        ? { description: "No content" }
        : {
            description: status.startsWith("2") ? "OK" : "Error",
            content: { "application/json": { schema: s } },
          };
  }
  return out;
}

export function e2bOpenApi(routes: readonly RouteOptions[]): Json {
  const paths: Record<string, Json> = {};
  const sorted = [...routes].sort((a, b) => `${a.url} ${a.method}`.localeCompare(`${b.url} ${b.method}`));
  for (const route of sorted) {
    const url = route.url.replace(/:(\w+)/g, "{$1}");
    const schema = (route.schema ?? {}) as Record<string, unknown>;
    const operation: Json = {
      ...(typeof schema.summary === "string" ? { summary: schema.summary } : {}),
      ...(typeof schema.description === "string" ? { description: schema.description } : {}),
      parameters: [...parameters("path", schema.params), ...parameters("query", schema.querystring)],
      responses: responses(schema.response as Record<string, unknown> | undefined),
    };
    if (schema.body !== undefined) {
      const body = unwrapOptional(plain(schema.body));
      operation.requestBody = {
        required: body.required,
        content: { "application/json": { schema: body.schema } },
      };
    }
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    paths[url] ??= {};
    for (const method of methods) (paths[url] as Json)[method.toLowerCase()] = operation;
  }
  return {
    openapi: "3.0.3",
    info: {
      title: "forkd's E2B API",
      version: FORKD_VERSION,
      description:
        "E2B's control plane as the forkd daemon serves it: point E2B_API_URL at the daemon and send a daemon " +
        'token as X-API-Key. Errors are {"code": <HTTP status>, "message": "..."}. See docs/e2b.md.',
    },
    components: { securitySchemes: { apiKey: { type: "apiKey", in: "header", name: "X-API-Key" } } },
    security: [{ apiKey: [] }],
    paths,
  };
}
