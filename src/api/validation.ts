/**
 * Request validation from the TypeBox schemas in schemas.ts. Bodies are checked strictly (no type coercion, unknown
 * fields rejected: a typo must not be silently ignored); query strings and path parameters arrive as strings and
 * are converted first ("5" -> 5, "true" -> true). Errors name the part and the field.
 */
import type { Static, TSchema } from "@sinclair/typebox";
import { TypeCompiler, type ValueError } from "@sinclair/typebox/compiler";
import { ValueErrorType } from "@sinclair/typebox/errors";
import { Value } from "@sinclair/typebox/value";
import type { FastifySchemaCompiler } from "fastify";
import { ForkdError } from "../common/errors.js";

const PART_NAMES: Record<string, string> = {
  body: "body",
  querystring: "query parameter",
  params: "path parameter",
  headers: "header",
};

export const typeboxValidatorCompiler: FastifySchemaCompiler<TSchema> = ({ schema, httpPart }) => {
  if ((schema as { format?: string }).format === "binary") return (data) => ({ value: data });
  const check = TypeCompiler.Compile(schema);
  const members = schema.anyOf as TSchema[] | undefined;
  const objects = members?.filter((member) => member.type === "object") ?? [];
  // An optional body (an object or nothing): an object that fails is described by the object's own errors.
  const objectCheck = objects.length === 1 ? TypeCompiler.Compile(objects[0] as TSchema) : undefined;
  const part = PART_NAMES[httpPart ?? "body"] ?? String(httpPart);
  const converts = httpPart !== "body";
  return (data) => {
    const value = converts ? Value.Convert(schema, Value.Default(schema, Value.Clone(data))) : data;
    if (check.Check(value)) return { value };
    const isObject = typeof value === "object" && value !== null && !Array.isArray(value);
    const first = (isObject ? objectCheck?.Errors(value).First() : undefined) ?? check.Errors(value).First();
    return { error: validationError(part, first) };
  };
};

function validationError(part: string, error: ValueError | undefined): ForkdError {
  if (!error) return new ForkdError("invalid_argument", `invalid ${part}`);
  const field = error.path.replace(/^\//, "").replaceAll("/", ".");
  if (error.type === ValueErrorType.ObjectAdditionalProperties) {
    return new ForkdError("invalid_argument", `unknown ${part} field ${JSON.stringify(field)}`);
  }
  if (field === "") {
    const what = part === "body" ? "a JSON object" : "valid";
    return new ForkdError("invalid_argument", `invalid ${part}: expected ${what}`);
  }
  if (error.type === ValueErrorType.ObjectRequiredProperty) {
    return new ForkdError("invalid_argument", `missing ${part} field ${JSON.stringify(field)}`);
  }
  return new ForkdError(
    "invalid_argument",
    `invalid ${part} field ${JSON.stringify(field)}: ${describe(error)}`,
  );
}

function describe(error: ValueError): string {
  const schema = error.schema as { pattern?: string; anyOf?: { type?: string; const?: unknown }[] };
  if (error.type === ValueErrorType.StringPattern && schema.pattern) {
    return `must match ${schema.pattern.replace(/^\^|\$$/g, "")}`;
  }
  if (error.type === ValueErrorType.Union && schema.anyOf) {
    const options = schema.anyOf.map((s) => (s.const !== undefined ? JSON.stringify(s.const) : s.type));
    return `expected ${options.join(" or ")}`;
  }
  return error.message.charAt(0).toLowerCase() + error.message.slice(1);
}

/** A strict body validator for data that does not come through Fastify's body parsing (NDJSON lines). */
export function compileBodyValidator<T extends TSchema>(
  schema: T,
  part = "body",
): (data: unknown) => Static<T> {
  const check = TypeCompiler.Compile(schema);
  return (data) => {
    if (check.Check(data)) return data;
    throw validationError(part, check.Errors(data).First());
  };
}
