/**
 * Both SDKs against the API's own contract, docs/openapi.json (generated from src/api/schemas.ts):
 * - every JSON document the TypeScript SDK declares (src/sdk/wire.ts) is mapped to the route that returns it, and
 *   each of its fields exists there, is required only where the API requires it, and accepts every JSON type the
 *   API may send in it (a declaration without an index signature declares every field);
 * - the error codes the API documents are the table's (src/common/limits.ts), which both SDKs use, and each maps
 *   to an error class of its own in the TypeScript SDK and to its status in the Python SDK;
 * - every request the Python SDK builds (sdk/python/forkd, read with Python's own parser) goes to a route the API
 *   has, with body and query fields the route accepts, and every field it reads from an answer is one the API sends.
 * The TypeScript declarations are read with TypeScript's parser.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { ERROR_CODES } from "../../src/common/limits.js";
import { errorFromResponse, ForkdSdkError } from "../../src/sdk/errors.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(here, here.includes(`${path.sep}dist${path.sep}`) ? "../../.." : "../..");

interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  anyOf?: Schema[];
  oneOf?: Schema[];
  allOf?: Schema[];
  enum?: unknown[];
  const?: unknown;
  additionalProperties?: boolean | Schema;
  /** OpenAPI 3.0's way to say "or null". */
  nullable?: boolean;
}
interface Operation {
  parameters?: { name: string; in: string }[];
  requestBody?: { content: Record<string, { schema: Schema }> };
  responses: Record<string, { content?: Record<string, { schema: Schema }> }>;
}
const openapi = JSON.parse(readFileSync(path.join(ROOT, "docs/openapi.json"), "utf8")) as {
  paths: Record<string, Record<string, Operation>>;
};

function operation(method: string, route: string): Operation {
  const op = openapi.paths[route]?.[method];
  assert.ok(op, `docs/openapi.json has ${method.toUpperCase()} ${route}`);
  return op;
}

function answer(method: string, route: string): Schema {
  const op = operation(method, route);
  const status = Object.keys(op.responses).find((s) => s.startsWith("2") && op.responses[s]?.content);
  const schema = status && op.responses[status]?.content?.["application/json"]?.schema;
  assert.ok(schema, `${method.toUpperCase()} ${route} answers JSON`);
  return schema;
}

/** A schema with its allOf merged (TypeBox's Composite is already flat; kept for safety). */
function flat(schema: Schema): Schema {
  if (!schema.allOf) return schema;
  const parts = schema.allOf.map(flat);
  return {
    type: "object",
    properties: Object.assign({}, ...parts.map((p) => p.properties ?? {})),
    required: parts.flatMap((p) => p.required ?? []),
  };
}

const items = (schema: Schema): Schema => {
  assert.ok(schema.items, "an array schema");
  return schema.items;
};
const field = (schema: Schema, name: string): Schema => {
  const inner = flat(schema).properties?.[name];
  assert.ok(inner, `field ${name}`);
  // An optional-or-null object field is anyOf [object, null]: the object part.
  return inner.anyOf?.find((s) => s.type === "object" || s.properties) ?? inner;
};

/** Where the API returns (or takes) each document of src/sdk/wire.ts. */
const SCHEMA_OF: Record<string, () => Schema> = {
  SandboxInfo: () => answer("get", "/v1/sandboxes/{id}"),
  SandboxLimits: () => field(answer("get", "/v1/sandboxes/{id}"), "limits"),
  SandboxNetwork: () => field(answer("get", "/v1/sandboxes/{id}"), "network"),
  EgressPolicyWire: () => {
    const body = operation("put", "/v1/sandboxes/{id}/network").requestBody?.content["application/json"]
      ?.schema;
    assert.ok(body, "PUT /v1/sandboxes/{id}/network takes JSON");
    return body;
  },
  NetworkStatus: () => answer("get", "/v1/network"),
  SnapshotInfo: () => items(answer("get", "/v1/snapshots")),
  SnapshotDetail: () => answer("get", "/v1/snapshots/{tag}/info"),
  LayerUsage: () => items(field(answer("get", "/v1/snapshots/{tag}/info"), "layers")),
  BranchResult: () => answer("post", "/v1/sandboxes/{id}/branch"),
  SnapshotDiffResult: () => answer("post", "/v1/snapshots/{tag}/diff"),
  ExecResult: () => answer("post", "/v1/sandboxes/{id}/exec"),
  EvalResult: () => answer("post", "/v1/sandboxes/{id}/eval"),
  PingResult: () => answer("post", "/v1/sandboxes/{id}/ping"),
  FileInfo: () => answer("get", "/v1/sandboxes/{id}/files/stat"),
  FileListing: () => answer("get", "/v1/sandboxes/{id}/files/list"),
  VersionInfo: () => answer("get", "/version"),
  UnpackResult: () => answer("post", "/v1/snapshots/unpack"),
  PauseResult: () => answer("post", "/v1/sandboxes/{id}/pause"),
  WorkspaceInfo: () => answer("get", "/v1/workspaces/{name}"),
};
/** The wire's string unions and where the API states their values. */
const ENUM_OF: Record<string, () => Schema> = {
  SandboxStatus: () => field(answer("get", "/v1/sandboxes/{id}"), "status"),
  SnapshotStatus: () => field(items(answer("get", "/v1/snapshots")), "status"),
  FileType: () => field(answer("get", "/v1/sandboxes/{id}/files/stat"), "type"),
};

// --- the TypeScript SDK's declarations ---------------------------------------------------------------------------

const wireFile = ts.createSourceFile(
  "wire.ts",
  readFileSync(path.join(ROOT, "src/sdk/wire.ts"), "utf8"),
  ts.ScriptTarget.ES2022,
  true,
);
const interfaces = new Map<string, ts.InterfaceDeclaration>();
const aliases = new Map<string, ts.TypeAliasDeclaration>();
for (const statement of wireFile.statements) {
  if (ts.isInterfaceDeclaration(statement)) interfaces.set(statement.name.text, statement);
  if (ts.isTypeAliasDeclaration(statement)) aliases.set(statement.name.text, statement);
}

interface Member {
  optional: boolean;
  type: ts.TypeNode;
}

/** An interface's members, its `extends` included; and whether it has an index signature. */
function membersOf(name: string): { members: Map<string, Member>; open: boolean } {
  const declaration = interfaces.get(name);
  assert.ok(declaration, `src/sdk/wire.ts declares ${name}`);
  const members = new Map<string, Member>();
  let open = false;
  for (const clause of declaration.heritageClauses ?? []) {
    for (const base of clause.types) {
      const inherited = membersOf(base.expression.getText(wireFile));
      for (const [key, member] of inherited.members) members.set(key, member);
      open ||= inherited.open;
    }
  }
  for (const member of declaration.members) {
    if (ts.isIndexSignatureDeclaration(member)) open = true;
    else if (ts.isPropertySignature(member) && member.type) {
      members.set(member.name.getText(wireFile), {
        optional: member.questionToken !== undefined,
        type: member.type,
      });
    }
  }
  return { members, open };
}

/** What a TypeScript type accepts, in JSON's terms; `literals` undefined = any string. */
interface Accepts {
  kinds: Set<string>;
  literals?: Set<unknown>;
}

function accepts(node: ts.TypeNode): Accepts {
  const out: Accepts = { kinds: new Set(), literals: new Set() };
  const add = (other: Accepts) => {
    for (const k of other.kinds) out.kinds.add(k);
    if (other.kinds.has("string") && other.literals === undefined) out.literals = undefined;
    else if (out.literals) for (const l of other.literals ?? []) out.literals.add(l);
  };
  if (ts.isUnionTypeNode(node)) {
    for (const part of node.types) add(accepts(part));
    return out;
  }
  if (ts.isParenthesizedTypeNode(node)) return accepts(node.type);
  if (ts.isIntersectionTypeNode(node)) return { kinds: new Set(["string"]) }; // `string & {}`: any string
  if (ts.isLiteralTypeNode(node)) {
    if (node.literal.kind === ts.SyntaxKind.NullKeyword)
      return { kinds: new Set(["null"]), literals: new Set() };
    if (ts.isStringLiteral(node.literal))
      return { kinds: new Set(["string"]), literals: new Set([node.literal.text]) };
    if (node.literal.kind === ts.SyntaxKind.TrueKeyword || node.literal.kind === ts.SyntaxKind.FalseKeyword) {
      return { kinds: new Set(["boolean"]), literals: new Set() };
    }
    return { kinds: new Set(["number"]), literals: new Set() };
  }
  if (ts.isArrayTypeNode(node) || ts.isTupleTypeNode(node))
    return { kinds: new Set(["array"]), literals: new Set() };
  if (ts.isTypeLiteralNode(node)) return { kinds: new Set(["object"]), literals: new Set() };
  if (ts.isTypeReferenceNode(node)) {
    const name = node.typeName.getText(wireFile);
    const alias = aliases.get(name);
    if (alias) return accepts(alias.type);
    if (name === "Array") return { kinds: new Set(["array"]), literals: new Set() };
    return { kinds: new Set(["object"]), literals: new Set() }; // an interface, Record<...>, Required<...>
  }
  switch (node.kind) {
    case ts.SyntaxKind.StringKeyword:
      return { kinds: new Set(["string"]) };
    case ts.SyntaxKind.NumberKeyword:
      return { kinds: new Set(["number"]), literals: new Set() };
    case ts.SyntaxKind.BooleanKeyword:
      return { kinds: new Set(["boolean"]), literals: new Set() };
    case ts.SyntaxKind.UnknownKeyword:
    case ts.SyntaxKind.AnyKeyword:
      return { kinds: new Set(["string", "number", "boolean", "null", "array", "object"]) };
    default:
      throw new Error(`no JSON reading of the type ${node.getText(wireFile)}`);
  }
}

/** What the API may send in a field: JSON types, and the strings allowed when they are an enum. */
function sends(schema: Schema): Accepts {
  if (schema.nullable) {
    const out = sends({ ...schema, nullable: false });
    out.kinds.add("null");
    return out;
  }
  const parts = schema.anyOf ?? schema.oneOf;
  if (parts) {
    const out: Accepts = { kinds: new Set(), literals: new Set() };
    for (const part of parts.map(sends)) {
      for (const k of part.kinds) out.kinds.add(k);
      if (part.kinds.has("string") && part.literals === undefined) out.literals = undefined;
      else if (out.literals) for (const l of part.literals ?? []) out.literals.add(l);
    }
    return out;
  }
  if (schema.const !== undefined)
    return { kinds: new Set([jsonKind(schema.const)]), literals: new Set([schema.const]) };
  if (schema.enum) return { kinds: new Set(schema.enum.map(jsonKind)), literals: new Set(schema.enum) };
  const types = schema.type === undefined ? [] : Array.isArray(schema.type) ? schema.type : [schema.type];
  if (types.length === 0)
    return { kinds: new Set(["string", "number", "boolean", "null", "array", "object"]) };
  return {
    kinds: new Set(types.map((t) => (t === "integer" ? "number" : t))),
    ...(types.includes("string") ? {} : { literals: new Set() }),
  };
}

function jsonKind(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

/** What the SDK type misses of what the API may send, or "" when it accepts all of it. */
function gap(sdk: Accepts, api: Accepts): string {
  const missing = [...api.kinds].filter((k) => !sdk.kinds.has(k));
  if (missing.length > 0) return `the API may send ${missing.join("/")}`;
  if (api.kinds.has("string") && sdk.literals !== undefined) {
    if (api.literals === undefined) return "the API may send any string, the SDK names only some";
    const unknown = [...api.literals].filter((l) => typeof l === "string" && !sdk.literals?.has(l));
    if (unknown.length > 0) return `the API may send ${unknown.map((l) => JSON.stringify(l)).join(", ")}`;
  }
  return "";
}

describe("the SDKs against docs/openapi.json", () => {
  it("maps every document of src/sdk/wire.ts to a route", () => {
    assert.deepEqual(
      [...interfaces.keys()].filter((name) => !(name in SCHEMA_OF)),
      [],
      "wire.ts interfaces without a route in SCHEMA_OF (test/sdk/wire-contract.test.ts)",
    );
    assert.deepEqual(
      [...aliases.keys()].filter((name) => !(name in ENUM_OF)),
      [],
      "wire.ts type aliases without a place in ENUM_OF",
    );
  });

  it("declares each field as the API sends it", () => {
    const problems: string[] = [];
    for (const [name, schemaOf] of Object.entries(SCHEMA_OF)) {
      const schema = flat(schemaOf());
      const properties = schema.properties ?? {};
      const required = new Set(schema.required ?? []);
      const { members, open } = membersOf(name);
      for (const [key, member] of members) {
        const api = properties[key];
        if (!api) {
          problems.push(`${name}.${key}: not a field of the API's document`);
          continue;
        }
        if (!member.optional && !required.has(key))
          problems.push(`${name}.${key}: required here, optional in the API`);
        const missing = gap(accepts(member.type), sends(api));
        if (missing)
          problems.push(`${name}.${key}: ${missing}, which ${member.type.getText(wireFile)} does not accept`);
      }
      if (!open) {
        for (const key of Object.keys(properties)) {
          if (!members.has(key)) problems.push(`${name}: declares no ${key} (and has no index signature)`);
        }
      }
    }
    for (const [name, schemaOf] of Object.entries(ENUM_OF)) {
      const alias = aliases.get(name) as ts.TypeAliasDeclaration;
      const missing = gap(accepts(alias.type), sends(schemaOf()));
      if (missing) problems.push(`${name}: ${missing}`);
    }
    assert.deepEqual(problems, [], "src/sdk/wire.ts against docs/openapi.json");
  });

  it("documents the table's error codes on every error answer, and the TypeScript SDK has a class for each", () => {
    const documented = new Set<string>();
    for (const [route, methods] of Object.entries(openapi.paths)) {
      for (const [method, op] of Object.entries(methods)) {
        for (const [status, response] of Object.entries(op.responses)) {
          if (!/^[45]/.test(status)) continue;
          const code = response.content?.["application/json"]?.schema.properties?.code;
          if (!code) continue;
          const values = code.enum ?? code.anyOf?.flatMap((s) => s.enum ?? []);
          assert.ok(values, `${method.toUpperCase()} ${route} ${status}: the error code is an enum`);
          for (const v of values) documented.add(String(v));
        }
      }
    }
    assert.deepEqual([...documented].sort(), Object.keys(ERROR_CODES).sort());
    for (const [code, status] of Object.entries(ERROR_CODES)) {
      const err = errorFromResponse(status, JSON.stringify({ error: "x", code }), { request: "GET /" });
      assert.ok(
        err instanceof ForkdSdkError && err.constructor !== ForkdSdkError,
        `${code} has an error class`,
      );
      assert.equal(err.code, code);
      const inStream = errorFromResponse(status, JSON.stringify({ error: "x", code }), {
        request: "POST /",
        inStream: true,
      });
      assert.equal(inStream.constructor, err.constructor, `${code} in a stream is the same class`);
      assert.equal(inStream.status, undefined, "an error inside a 200 stream has no HTTP status");
    }
  });

  it("has the Python SDK speak only routes, fields and error codes the API has", () => {
    const python = JSON.parse(
      execFileSync(
        "python3",
        [path.join(ROOT, "test/sdk/python-wire.py"), path.join(ROOT, "sdk/python/forkd")],
        {
          encoding: "utf8",
        },
      ),
    ) as {
      requests: { method: string; route: string; body: string[]; query: string[]; where: string }[];
      reads: { key: string; where: string }[];
      status_of_code: Record<string, number>;
    };
    assert.ok(python.requests.length >= 30, `found the Python SDK's requests (${python.requests.length})`);
    const problems: string[] = [];
    const sent = new Set<string>();
    for (const request of python.requests) {
      const route = Object.keys(openapi.paths).find(
        (r) => r.replace(/\{[^}]+\}/g, "{}") === request.route.replace(/\{[^}]*\}/g, "{}"),
      );
      const op = route ? openapi.paths[route]?.[request.method.toLowerCase()] : undefined;
      if (!op) {
        problems.push(`${request.where}: ${request.method} ${request.route} is not a route of the API`);
        continue;
      }
      sent.add(`${request.method} ${route}`);
      const body = op.requestBody?.content["application/json"]?.schema ?? {};
      // An optional body is anyOf [the object, null]: its object's fields.
      const bodyFields = new Set(
        [body, ...(body.anyOf ?? [])].flatMap((part) => Object.keys(flat(part).properties ?? {})),
      );
      for (const key of request.body) {
        if (!bodyFields.has(key))
          problems.push(`${request.where}: ${request.method} ${route} takes no body field ${key}`);
      }
      const queryFields = new Set((op.parameters ?? []).filter((p) => p.in === "query").map((p) => p.name));
      for (const key of request.query) {
        if (!queryFields.has(key))
          problems.push(`${request.where}: ${request.method} ${route} takes no query ${key}`);
      }
    }
    const answered = new Set<string>();
    const collect = (schema: Schema | undefined) => {
      if (!schema) return;
      for (const [key, inner] of Object.entries(schema.properties ?? {})) {
        answered.add(key);
        collect(inner);
      }
      for (const part of [...(schema.anyOf ?? []), ...(schema.oneOf ?? []), ...(schema.allOf ?? [])])
        collect(part);
      collect(schema.items);
    };
    for (const methods of Object.values(openapi.paths)) {
      for (const op of Object.values(methods)) {
        for (const response of Object.values(op.responses)) {
          for (const content of Object.values(response.content ?? {})) collect(content.schema);
        }
      }
    }
    for (const read of python.reads) {
      if (!answered.has(read.key))
        problems.push(`${read.where}: reads ${read.key}, which no answer of the API has`);
    }
    assert.deepEqual(problems, [], "the Python SDK against docs/openapi.json");
    assert.deepEqual(python.status_of_code, ERROR_CODES, "the Python SDK's statuses of the error codes");
  });
});
