/**
 * Generates the Go side of the protocol from the TypeBox declaration (this folder is the one definition):
 * structs with json tags for every header kind and every op's args and result, a decoder and a Validate() for
 * everything the guest receives (exactly the schema's rules: unknown fields where additionalProperties is false,
 * required vs optional, nulls, string lengths in UTF-16 units and patterns, integer/number bounds, array bounds,
 * literal unions, records with key patterns), the op table, a typed handler interface, the limits and the error
 * codes. Patterns are translated to RE2 only when they mean the same there; anything else is refused.
 *
 * Used by scripts/gen-agent-go.ts (writes src/agent/guest/protocol/protocol_gen.go) and by the test that fails
 * when the committed file is stale.
 */
import { Kind, OptionalKind, type TSchema } from "@sinclair/typebox";
import { ERROR_CODES } from "../../common/errors.js";
import * as limits from "./limits.js";
import * as messages from "./messages.js";
import * as ops from "./ops.js";

type Schema = TSchema & Record<string, unknown>;

/** Go names of header-kind union variants (the only unions of objects in the protocol). */
const UNION_VARIANT_NAMES: Record<string, string[]> = { ResponseHeader: ["ResultHeader", "ErrorHeader"] };
/** Header kinds the guest receives: decoded and validated. The rest are only encoded. */
const HOST_HEADERS = { req: "RequestHeader", in: "InputHeader", cancel: "CancelHeader" } as const;
const GUEST_HEADERS = ["HelloHeader", "ResponseHeader", "EventHeader"] as const;

const INITIALISMS: Record<string, string> = {
  id: "ID",
  ms: "Ms",
  ns: "Ns",
  pid: "Pid",
  uid: "UID",
  gid: "GID",
};

export function goName(name: string): string {
  return name
    .split(/[^A-Za-z0-9]+/)
    .filter((p) => p !== "")
    .map((p) => {
      const lower = p.toLowerCase();
      if (lower === "id") return "ID";
      return /^[A-Z0-9]+$/.test(p) ? p[0] + p.slice(1).toLowerCase() : p[0]?.toUpperCase() + p.slice(1);
    })
    .join("");
}

function fieldName(prop: string): string {
  return prop
    .split("_")
    .map((p) => INITIALISMS[p] ?? (p[0]?.toUpperCase() ?? "") + p.slice(1))
    .join("");
}

const isSchema = (v: unknown): v is Schema => typeof v === "object" && v !== null && Kind in v;
const isOptional = (s: Schema) => (s as unknown as Record<symbol, unknown>)[OptionalKind] === "Optional";
const kindOf = (s: Schema) => (s as unknown as Record<symbol, unknown>)[Kind] as string;

// ---- patterns: JavaScript RegExp (no flags, UTF-16 code units) -> RE2, refusing what could differ

/**
 * Accepts only constructs whose meaning is identical in a flagless JavaScript RegExp and in Go's RE2 over
 * valid UTF-8 text: ^ and $ (no multiline flag: both anchor the whole input), ASCII literals, the escapes
 * \x.. \$ \. \- \\ \/ and the like, character classes of ASCII characters and ranges, groups, alternation, and
 * the quantifiers * + ? {n} {n,} {n,m} (lazy ones too: only whether a string matches is ever asked, and that
 * does not depend on laziness). A negated class also matches astral characters, which JavaScript sees
 * as two code units, so a negated class may only be repeated without an upper bound (* or +) where the count
 * cannot tell the difference. Shorthands (\d \w \s \b), '.', lookarounds and back-references are refused.
 */
export function translatePattern(pattern: string): string {
  return new PatternTranslation(pattern).run();
}

const isAsciiPrintable = (c: string) => c >= " " && c <= "~";

/** One translatePattern: reads `pattern` left to right, writing the RE2 form. */
class PatternTranslation {
  private i = 0;
  private out = "";
  /** The last atom was a negated class (it may not be repeated a bounded number of times). */
  private lastAtomNegatedClass = false;

  constructor(private readonly pattern: string) {}

  run(): string {
    const { pattern } = this;
    while (this.i < pattern.length) {
      const c = pattern[this.i] as string;
      if (c === "\\") {
        this.out += this.readEscape();
        this.lastAtomNegatedClass = false;
      } else if (c === "[") {
        this.readClass();
      } else if (c === "{") {
        this.readRepetition();
      } else if (c === "(") {
        if (pattern[this.i + 1] === "?") this.fail("group modifiers and lookarounds");
        this.out += c;
        this.i++;
        this.lastAtomNegatedClass = false;
      } else if (c === ".") {
        this.fail("'.' (JavaScript excludes \\r, \\u2028 and \\u2029, RE2 only \\n)");
      } else if (c === "$" && this.i !== pattern.length - 1) {
        this.fail("'$' before the end");
      } else if (c === "^" && this.i !== 0) {
        this.fail("'^' after the start");
      } else if ("*+?|)^$".includes(c) || isAsciiPrintable(c)) {
        this.out += c;
        this.i++;
        if (!"*+?".includes(c)) this.lastAtomNegatedClass = false;
      } else {
        this.fail(`character ${JSON.stringify(c)}`);
      }
    }
    return this.out;
  }

  private fail(why: string): never {
    throw new Error(`pattern ${JSON.stringify(this.pattern)} cannot be translated to RE2 faithfully: ${why}`);
  }

  private readEscape(): string {
    const { pattern, i } = this;
    const c = pattern[i + 1];
    if (c === undefined) this.fail("trailing backslash");
    if (c === "x") {
      const hex = pattern.slice(i + 2, i + 4);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) this.fail("bad \\x escape");
      this.i += 4;
      return `\\x${hex}`;
    }
    if (/[A-Za-z0-9]/.test(c as string)) this.fail(`escape \\${c} has no identical RE2 meaning`);
    this.i += 2;
    return `\\${c}`;
  }

  /** A character class: ASCII characters, ranges and escapes only. */
  private readClass(): void {
    const { pattern } = this;
    let cls = "[";
    this.i++;
    const negated = pattern[this.i] === "^";
    if (negated) {
      cls += "^";
      this.i++;
    }
    let closed = false;
    while (this.i < pattern.length) {
      const d = pattern[this.i] as string;
      if (d === "]") {
        closed = true;
        this.i++;
        break;
      }
      if (d === "\\") cls += this.readEscape();
      else if (d === "[") this.fail("nested '[' in a class");
      else if (!isAsciiPrintable(d)) this.fail("non-ASCII character in a class");
      else {
        cls += d;
        this.i++;
      }
    }
    if (!closed) this.fail("unterminated class");
    this.out += `${cls}]`;
    this.lastAtomNegatedClass = negated;
  }

  /** {n}, {n,} or {n,m}, within RE2's limit. */
  private readRepetition(): void {
    const m = /^\{(\d+)(,(\d*))?\}/.exec(this.pattern.slice(this.i));
    if (!m) this.fail("bad repetition");
    const bounded = m?.[2] === undefined || (m[3] ?? "") !== "";
    if (this.lastAtomNegatedClass && bounded) this.fail("a negated class repeated a bounded number of times");
    if (Number(m?.[1]) > 1000 || Number(m?.[3] || 0) > 1000)
      this.fail("repetition above RE2's limit of 1000");
    this.out += m?.[0];
    this.i += m?.[0].length ?? 0;
  }
}

// ---- the model: named Go types for the schemas

interface GoStruct {
  name: string;
  schema: Schema;
  /** Decoded and validated (something the guest receives). */
  input: boolean;
}

class Model {
  readonly structs = new Map<string, GoStruct>();
  readonly patterns = new Map<string, string>();
  private readonly names = new Map<Schema, string>();
  /** TypeBox clones schemas it composes, so nested ones are recognised by their structure. */
  private readonly shapes = new Map<string, string>();

  constructor(named: Record<string, unknown>[]) {
    const candidates = new Map<Schema, string[]>();
    for (const module of named) {
      for (const [name, value] of Object.entries(module)) {
        if (!isSchema(value) || kindOf(value) !== "Object") continue;
        const list = candidates.get(value) ?? [];
        list.push(name);
        candidates.set(value, list);
      }
    }
    for (const [schema, list] of candidates) {
      // An alias like FileStatResult = FileInfo keeps the descriptive name.
      const sorted = [...list].sort();
      const name = sorted.find((n) => !/(Args|Result)$/.test(n)) ?? (sorted[0] as string);
      this.names.set(schema, name);
      const shape = canonical(schema);
      const other = this.shapes.get(shape);
      // Of equal shapes the descriptive name wins (PtySize over an args alias).
      if (other === undefined || (/(Args|Result)$/.test(other) && !/(Args|Result)$/.test(name))) {
        this.shapes.set(shape, name);
      }
    }
  }

  /** The Go struct name of an object schema, registering it (anonymous ones are named after their place). */
  struct(schema: Schema, fallback: string, input: boolean): string {
    const name = this.names.get(schema) ?? this.shapes.get(canonical(schema)) ?? fallback;
    const existing = this.structs.get(name);
    if (existing !== undefined) {
      if (canonical(existing.schema) !== canonical(schema)) {
        throw new Error(`two different schemas want the Go name ${name}`);
      }
      if (input && !existing.input) {
        existing.input = true;
        this.walk(name, schema, true);
      }
      return name;
    }
    this.names.set(schema, name);
    this.structs.set(name, { name, schema, input });
    this.walk(name, schema, input);
    return name;
  }

  pattern(pattern: string): string {
    let v = this.patterns.get(pattern);
    if (v === undefined) {
      translatePattern(pattern); // refuses what RE2 would read differently
      v = `pattern${this.patterns.size}`;
      this.patterns.set(pattern, v);
    }
    return v;
  }

  private walk(name: string, schema: Schema, input: boolean): void {
    for (const [prop, sub] of Object.entries(schema.properties as Record<string, Schema>)) {
      this.goType(sub, name + fieldName(prop), input);
    }
  }

  /** The Go type of a schema (without the pointer an optional field adds). */
  goType(s: Schema, place: string, input: boolean): string {
    // Only what the guest validates needs its patterns in RE2.
    if (input && typeof s.pattern === "string") this.pattern(s.pattern);
    const nullable = nullableOf(s);
    if (nullable !== undefined) return `*${this.goType(nullable, place, input)}`;
    if (isLiteralUnion(s)) return literalUnionType(s);
    switch (kindOf(s)) {
      case "String":
        return "string";
      case "Integer":
        return "int64";
      case "Number":
        return "float64";
      case "Boolean":
        return "bool";
      case "Literal":
        return typeof s.const === "boolean" ? "bool" : typeof s.const === "number" ? "int64" : "string";
      case "Unknown":
        return "json.RawMessage";
      case "Array":
        return `[]${this.goType(s.items as Schema, place, input)}`;
      case "Record": {
        const [keyPattern, value] = recordParts(s);
        if (input) this.pattern(keyPattern);
        return `map[string]${this.goType(value, place, input)}`;
      }
      case "Object":
        return this.struct(s, place, input);
      default:
        throw new Error(`${place}: no Go mapping for a ${kindOf(s)} schema`);
    }
  }
}

/** JSON of a schema with sorted keys, optionality included (symbols are invisible to JSON.stringify). */
function canonical(s: unknown, root = true): string {
  if (Array.isArray(s)) return `[${s.map((v) => canonical(v, false)).join(",")}]`;
  if (s !== null && typeof s === "object") {
    const o = s as Record<string, unknown>;
    // Whether a property is optional belongs to its parent's shape, not to the type's own.
    const optional = !root && isSchema(o) && isOptional(o as Schema) ? "?" : "";
    return `${optional}{${Object.keys(o)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k], false)}`)
      .join(",")}}`;
  }
  return JSON.stringify(s);
}

function nullableOf(s: Schema): Schema | undefined {
  if (kindOf(s) !== "Union") return undefined;
  const variants = s.anyOf as Schema[];
  const nonNull = variants.filter((v) => kindOf(v) !== "Null");
  if (variants.length === 2 && nonNull.length === 1) return nonNull[0];
  return undefined;
}

function isLiteralUnion(s: Schema): boolean {
  return kindOf(s) === "Union" && (s.anyOf as Schema[]).every((v) => kindOf(v) === "Literal");
}

function literalUnionType(s: Schema): string {
  const types = new Set((s.anyOf as Schema[]).map((v) => typeof v.const));
  if (types.size !== 1 || !types.has("string"))
    throw new Error("only unions of string literals are supported");
  return "string";
}

function recordParts(s: Schema): [string, Schema] {
  const entries = Object.entries(s.patternProperties as Record<string, Schema>);
  if (entries.length !== 1) throw new Error("a record needs exactly one key pattern");
  return entries[0] as [string, Schema];
}

// ---- emitting Go

const goString = (v: string) => JSON.stringify(v);

function structDecl(model: Model, st: GoStruct): string {
  const props = Object.entries(st.schema.properties as Record<string, Schema>);
  const required = new Set((st.schema.required as string[] | undefined) ?? []);
  const lines = props.map(([prop, sub]) => {
    const type = model.goType(sub, st.name + fieldName(prop), st.input);
    const optional = !required.has(prop) || isOptional(sub);
    const pointer = optional && !/^(\[\]|map\[|json\.RawMessage|\*)/.test(type);
    const tag = optional ? `json:"${prop},omitempty"` : `json:"${prop}"`;
    return `\t${fieldName(prop)} ${pointer ? "*" : ""}${type} \`${tag}\``;
  });
  const doc = typeof st.schema.description === "string" ? `// ${st.name}: ${st.schema.description}\n` : "";
  return `${doc}type ${st.name} struct {\n${lines.join("\n")}\n}\n`;
}

/** Go statements that decode `raw` (a json.RawMessage) at `path` into `target` of schema `s`. */
function decodeInto(
  model: Model,
  s: Schema,
  raw: string,
  path: string,
  target: string,
  place: string,
): string {
  const nullable = nullableOf(s);
  if (nullable !== undefined) {
    const inner = model.goType(nullable, place, true);
    return `if !isNull(${raw}) {\n\tvar v ${inner}\n${indent(decodeInto(model, nullable, raw, path, "v", place))}\n\t${target} = &v\n}`;
  }
  if (isLiteralUnion(s))
    return `if err := decodeString(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
  switch (kindOf(s)) {
    case "String":
      return `if err := decodeString(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
    case "Literal":
      if (typeof s.const === "boolean")
        return `if err := decodeBool(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
      return `if err := decodeString(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
    case "Integer":
      return `if err := decodeInteger(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
    case "Number":
      return `if err := decodeNumber(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
    case "Boolean":
      return `if err := decodeBool(${raw}, ${path}, &${target}); err != nil {\n\treturn err\n}`;
    case "Unknown":
      return `${target} = ${raw}`;
    case "Array": {
      const elem = model.goType(s.items as Schema, place, true);
      return [
        `{\n\tvar items []json.RawMessage\n\tif err := decodeArray(${raw}, ${path}, &items); err != nil {\n\t\treturn err\n\t}`,
        `\t${target} = make([]${elem}, len(items))`,
        `\tfor i, item := range items {`,
        indent(
          indent(
            decodeInto(
              model,
              s.items as Schema,
              "item",
              `${path} + "/" + strconv.Itoa(i)`,
              `${target}[i]`,
              place,
            ),
          ),
        ),
        "\t}\n}",
      ].join("\n");
    }
    case "Record": {
      const [, value] = recordParts(s);
      const type = model.goType(value, place, true);
      return [
        `{\n\tvar entries map[string]json.RawMessage\n\tif err := decodeObject(${raw}, ${path}, &entries); err != nil {\n\t\treturn err\n\t}`,
        `\t${target} = make(map[string]${type}, len(entries))`,
        "\tfor k, item := range entries {",
        `\t\tvar v ${type}`,
        indent(indent(decodeInto(model, value, "item", `${path} + "/" + pointerEscape(k)`, "v", place))),
        `\t\t${target}[k] = v`,
        "\t}\n}",
      ].join("\n");
    }
    case "Object": {
      model.struct(s, place, true);
      return `{\n\tvar m map[string]json.RawMessage\n\tif err := decodeObject(${raw}, ${path}, &m); err != nil {\n\t\treturn err\n\t}\n\tif err := ${target}.decodeFields(m, ${path}); err != nil {\n\t\treturn err\n\t}\n}`;
    }
    default:
      throw new Error(`${place}: cannot decode a ${kindOf(s)} schema`);
  }
}

function indent(code: string): string {
  return code
    .split("\n")
    .map((l) => (l === "" ? l : `\t${l}`))
    .join("\n");
}

function decoderDecl(model: Model, st: GoStruct): string {
  const props = Object.entries(st.schema.properties as Record<string, Schema>);
  const required = new Set((st.schema.required as string[] | undefined) ?? []);
  const strict = st.schema.additionalProperties === false;
  const body: string[] = [];
  for (const [prop, sub] of props) {
    const optional = !required.has(prop) || isOptional(sub);
    const type = model.goType(sub, st.name + fieldName(prop), true);
    const pointer = optional && !/^(\[\]|map\[|json\.RawMessage|\*)/.test(type);
    const path = `path + ${goString(`/${prop}`)}`;
    let decode: string;
    if (pointer) {
      decode = `var v ${type}\n${decodeInto(model, sub, "raw", path, "v", st.name + fieldName(prop))}\nx.${fieldName(prop)} = &v`;
      // An optional field that is present must not be null (the schema has no null there).
      decode = `if isNull(raw) {\n\treturn schemaError(${path}, "Expected ${expectedWord(sub)}", ${goString(String(sub.description ?? ""))})\n}\n${decode}`;
    } else {
      decode = decodeInto(model, sub, "raw", path, `x.${fieldName(prop)}`, st.name + fieldName(prop));
      if (!type.startsWith("*") && !type.startsWith("json.RawMessage")) {
        decode = `if isNull(raw) {\n\treturn schemaError(${path}, "Expected ${expectedWord(sub)}", ${goString(String(sub.description ?? ""))})\n}\n${decode}`;
      }
    }
    const missing = optional
      ? ""
      : ` else {\n\treturn schemaError(${path}, "Expected required property", "")\n}`;
    body.push(`if raw, ok := m[${goString(prop)}]; ok {\n${indent(decode)}\n}${missing}`);
  }
  if (strict) {
    const known = props.map(([p]) => goString(p)).join(", ");
    body.push(
      `if err := rejectUnknown(m, path, ${props.length}, ${known === "" ? "" : known}); err != nil {\n\treturn err\n}`,
    );
  }
  return `func (x *${st.name}) decodeFields(m map[string]json.RawMessage, path string) error {\n${indent(body.join("\n"))}\n\treturn nil\n}\n\n// UnmarshalJSON decodes with the schema's structural rules; Validate checks the rest.\nfunc (x *${st.name}) UnmarshalJSON(b []byte) error {\n\tvar m map[string]json.RawMessage\n\tif err := decodeObject(b, "", &m); err != nil {\n\t\treturn err\n\t}\n\treturn x.decodeFields(m, "")\n}\n`;
}

function expectedWord(s: Schema): string {
  if (isLiteralUnion(s)) return "union value";
  switch (kindOf(s)) {
    case "String":
      return "string";
    case "Integer":
      return "integer";
    case "Number":
      return "number";
    case "Boolean":
      return "boolean";
    case "Array":
      return "array";
    case "Literal":
      return typeof s.const === "boolean" ? "boolean" : "string";
    default:
      return "object";
  }
}

/** Go statements checking the constraints of `value` (already decoded) against `s`. */
function checks(model: Model, s: Schema, value: string, path: string, place: string): string {
  const desc = goString(String(s.description ?? ""));
  const nullable = nullableOf(s);
  if (nullable !== undefined) {
    const inner = checks(model, nullable, `(*${value})`, path, place);
    return inner === "" ? "" : `if ${value} != nil {\n${indent(inner)}\n}`;
  }
  if (isLiteralUnion(s)) {
    const values = (s.anyOf as Schema[]).map((v) => goString(String(v.const)));
    return `switch ${value} {\ncase ${values.join(", ")}:\ndefault:\n\treturn schemaError(${path}, "Expected union value", ${desc})\n}`;
  }
  const check: Check = { model, value, path, place, desc };
  switch (kindOf(s)) {
    case "String":
      return stringChecks(check, s).join("\n");
    case "Literal":
      return `if ${value} != ${typeof s.const === "string" ? goString(s.const) : String(s.const)} {\n\treturn schemaError(${path}, ${goString(`Expected ${JSON.stringify(s.const)}`)}, ${desc})\n}`;
    case "Integer":
    case "Number":
      return numberChecks(check, s).join("\n");
    case "Array":
      return arrayChecks(check, s).join("\n");
    case "Record": {
      const [keyPattern, valueSchema] = recordParts(s);
      const inner = checks(model, valueSchema, "v", `${path} + "/" + pointerEscape(k)`, place);
      return `for k, v := range ${value} {\n\t_ = v\n\tif !${model.pattern(keyPattern)}.MatchString(k) {\n\t\treturn schemaError(${path} + "/" + pointerEscape(k), ${goString(`Expected property name to match '${keyPattern}'`)}, "")\n\t}\n${inner === "" ? "" : indent(inner)}\n}`;
    }
    case "Object":
      model.struct(s, place, true);
      return `if err := ${value}.validate(${path}); err != nil {\n\treturn err\n}`;
    default:
      return "";
  }
}

/** What one constraint check is about: the Go expression, its JSON pointer (a Go expression) and its schema's place. */
interface Check {
  model: Model;
  value: string;
  path: string;
  place: string;
  /** The schema's description as a Go string (error messages carry it). */
  desc: string;
}

function stringChecks({ model, value, path, desc }: Check, s: Schema): string[] {
  const out: string[] = [];
  if (typeof s.minLength === "number")
    out.push(
      `if utf16Len(${value}) < ${s.minLength} {\n\treturn schemaError(${path}, "Expected string length greater or equal to ${s.minLength}", ${desc})\n}`,
    );
  if (typeof s.maxLength === "number")
    out.push(
      `if utf16Len(${value}) > ${s.maxLength} {\n\treturn schemaError(${path}, "Expected string length less or equal to ${s.maxLength}", ${desc})\n}`,
    );
  if (typeof s.pattern === "string")
    out.push(
      `if !${model.pattern(s.pattern)}.MatchString(${value}) {\n\treturn schemaError(${path}, ${goString(`Expected string to match '${s.pattern}'`)}, ${desc})\n}`,
    );
  return out;
}

function numberChecks({ value, path, place, desc }: Check, s: Schema): string[] {
  const out: string[] = [];
  const word = kindOf(s) === "Integer" ? "integer" : "number";
  if (typeof s.minimum === "number")
    out.push(
      `if ${value} < ${s.minimum} {\n\treturn schemaError(${path}, "Expected ${word} to be greater or equal to ${s.minimum}", ${desc})\n}`,
    );
  if (typeof s.maximum === "number")
    out.push(
      `if ${value} > ${s.maximum} {\n\treturn schemaError(${path}, "Expected ${word} to be less or equal to ${s.maximum}", ${desc})\n}`,
    );
  for (const key of ["exclusiveMinimum", "exclusiveMaximum", "multipleOf"]) {
    if (key in s) throw new Error(`${place}: ${key} is not supported by the Go generator`);
  }
  return out;
}

function arrayChecks({ model, value, path, place, desc }: Check, s: Schema): string[] {
  const out: string[] = [];
  if (typeof s.minItems === "number")
    out.push(
      `if len(${value}) < ${s.minItems} {\n\treturn schemaError(${path}, "Expected array length to be greater or equal to ${s.minItems}", ${desc})\n}`,
    );
  if (typeof s.maxItems === "number")
    out.push(
      `if len(${value}) > ${s.maxItems} {\n\treturn schemaError(${path}, "Expected array length to be less or equal to ${s.maxItems}", ${desc})\n}`,
    );
  if ("uniqueItems" in s) throw new Error(`${place}: uniqueItems is not supported by the Go generator`);
  const inner = checks(model, s.items as Schema, `${value}[i]`, `${path} + "/" + strconv.Itoa(i)`, place);
  if (inner !== "") out.push(`for i := range ${value} {\n${indent(inner)}\n}`);
  return out;
}

function validatorDecl(model: Model, st: GoStruct): string {
  const props = Object.entries(st.schema.properties as Record<string, Schema>);
  const required = new Set((st.schema.required as string[] | undefined) ?? []);
  const body: string[] = [];
  for (const [prop, sub] of props) {
    const optional = !required.has(prop) || isOptional(sub);
    const type = model.goType(sub, st.name + fieldName(prop), true);
    const pointer = optional && !/^(\[\]|map\[|json\.RawMessage|\*)/.test(type);
    const field = `x.${fieldName(prop)}`;
    const path = `path + ${goString(`/${prop}`)}`;
    const inner = checks(model, sub, pointer ? `(*${field})` : field, path, st.name + fieldName(prop));
    if (inner === "") continue;
    body.push(pointer ? `if ${field} != nil {\n${indent(inner)}\n}` : inner);
  }
  return `// Validate checks ${st.name} against its schema's constraints; errors name the field.\nfunc (x *${st.name}) Validate() error {\n\treturn x.validate("")\n}\n\nfunc (x *${st.name}) validate(path string) error {\n${indent(body.join("\n"))}\n\treturn nil\n}\n`;
}

function limitConsts(): string {
  const lines: string[] = [];
  for (const [name, value] of Object.entries(limits).sort(([a], [b]) => (a < b ? -1 : 1))) {
    if (typeof value === "number") lines.push(`\t${goName(name)} = ${value}`);
    else if (typeof value === "string" && name.endsWith("_PATTERN"))
      lines.push(`\t${goName(name)} = ${goString(translatePattern(value))}`);
    else if (Buffer.isBuffer(value))
      lines.push(
        `\t${goName(name)} = "${[...value].map((b) => `\\x${b.toString(16).padStart(2, "0")}`).join("")}"`,
      );
  }
  return `// Limits and versions of limits.ts.\nconst (\n${lines.join("\n")}\n)\n`;
}

function errorCodes(): string {
  const lines = Object.keys(ERROR_CODES).map((code) => `\tCode${goName(code)} = ${goString(code)}`);
  return `// The forkd error catalogue (src/common/errors.ts).\nconst (\n${lines.join("\n")}\n)\n`;
}

function opTable(model: Model): string {
  const entries = Object.entries(ops.OPS);
  const specs: string[] = [];
  const methods: string[] = [];
  const cases: string[] = [];
  for (const [name, spec] of entries) {
    const args = model.struct(spec.args as Schema, `${goName(name)}Args`, true);
    const result = model.struct(spec.result as Schema, `${goName(name)}Result`, false);
    const method = goName(name);
    specs.push(
      `\t${goString(name)}: {Name: ${goString(name)}, RequestBody: ${goString(spec.requestBody)}, ResponseBody: ${goString(spec.responseBody)}, Input: ${spec.input}, decode: func(b []byte) (any, error) {\n\t\tvar a ${args}\n\t\tif err := decodeArgs(b, &a); err != nil {\n\t\t\treturn nil, err\n\t\t}\n\t\treturn &a, a.Validate()\n\t}},`,
    );
    methods.push(`\t${method}(call C, args *${args}, body []byte) (*${result}, []byte, error)`);
    cases.push(
      `\tcase ${goString(name)}:\n\t\tresult, out, err := h.${method}(call, args.(*${args}), body)\n\t\tif result == nil || err != nil {\n\t\t\treturn nil, out, err\n\t\t}\n\t\treturn result, out, nil`,
    );
  }
  return [
    "// Ops is the op table of ops.ts: bodies, input, and the decoder + validator of each op's arguments.",
    `var Ops = map[string]*OpSpec{\n${specs.join("\n")}\n}\n`,
    "// Handlers serves every op: the result (nil with an error), and the response body for byte-bodied ops.",
    `type Handlers[C any] interface {\n${methods.join("\n")}\n}\n`,
    "// Dispatch calls the handler of op with arguments decoded by Ops[op].",
    `func Dispatch[C any](h Handlers[C], call C, op string, args any, body []byte) (any, []byte, error) {\n\tswitch op {\n${cases.join("\n")}\n\t}\n\treturn nil, nil, errUnknownOp(op)\n}\n`,
  ].join("\n");
}

function headerDecls(model: Model): string {
  for (const name of GUEST_HEADERS) {
    const schema = (messages as unknown as Record<string, Schema>)[name] as Schema;
    if (kindOf(schema) === "Union") {
      const variants = schema.anyOf as Schema[];
      const names = UNION_VARIANT_NAMES[name];
      if (names === undefined || names.length !== variants.length)
        throw new Error(`name the variants of ${name}`);
      for (const [i, v] of variants.entries()) model.struct(v, names[i] as string, false);
    } else model.struct(schema, name, false);
  }
  for (const name of Object.values(HOST_HEADERS)) {
    model.struct((messages as unknown as Record<string, Schema>)[name] as Schema, name, true);
  }
  const cases = Object.entries(HOST_HEADERS).map(
    ([t, name]) =>
      `\tcase ${goString(t)}:\n\t\tvar x ${name}\n\t\tif err := x.decodeFields(m, ""); err != nil {\n\t\t\treturn nil, err\n\t\t}\n\t\treturn &x, x.Validate()`,
  );
  return `// ParseHostMessage validates a header the guest received (kinds ${Object.keys(HOST_HEADERS).join(", ")}), already split into its fields.\nfunc ParseHostMessage(m map[string]json.RawMessage) (any, error) {\n\tvar t string\n\tif raw, ok := m["t"]; !ok || decodeString(raw, "/t", &t) != nil {\n\t\treturn nil, schemaError("/t", "Expected string", "")\n\t}\n\tswitch t {\n${cases.join("\n")}\n\t}\n\treturn nil, errUnknownKind(t)\n}\n`;
}

/** The whole generated Go file. */
export function generateGo(): string {
  const model = new Model([
    ops as unknown as Record<string, unknown>,
    messages as unknown as Record<string, unknown>,
  ]);
  const headers = headerDecls(model);
  const table = opTable(model);
  const structs = [...model.structs.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
  // Walking the validators may register more patterns: emit them first, then the pattern table.
  const code = structs
    .map((st) =>
      [structDecl(model, st), ...(st.input ? [decoderDecl(model, st), validatorDecl(model, st)] : [])].join(
        "\n",
      ),
    )
    .join("\n");
  const patterns = [...model.patterns.entries()].map(
    ([source, v]) => `\t${v} = regexp.MustCompile(${goString(translatePattern(source))})`,
  );
  return [
    "// Code generated by scripts/gen-agent-go.ts from src/agent/protocol (TypeBox). DO NOT EDIT.",
    "",
    "package protocol",
    "",
    'import (\n\t"encoding/json"\n\t"regexp"\n\t"strconv"\n)',
    "",
    limitConsts(),
    errorCodes(),
    `var (\n${patterns.join("\n")}\n)\n`,
    code,
    headers,
    table,
  ].join("\n");
}
