/**
 * `npm run limits:python`: writes sdk/python/forkd/_limits.py from src/common/limits.ts, the one table of limits
 * and names; `--check` only compares and exits 1 when the committed file is stale (test/sdk/python-limits.test.ts
 * does the same). Each exported constant becomes a `Final` of the same name with its doc comment; patterns are
 * refused unless Python's `re` reads them as JavaScript does.
 */
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import * as limits from "../src/common/limits.js";

const here = path.dirname(fileURLToPath(import.meta.url));
/** The repository root, whether this runs from scripts/ (tsx) or from dist/scripts/ (a compiled test). */
export const REPO_ROOT = path.resolve(here, here.includes(`${path.sep}dist${path.sep}`) ? "../.." : "..");
export const LIMITS_SOURCE = path.join(REPO_ROOT, "src/common/limits.ts");
export const PYTHON_LIMITS = path.join(REPO_ROOT, "sdk/python/forkd/_limits.py");

/** One exported constant of limits.ts, in source order, with its doc comment and the section it is in. */
export interface TableEntry {
  name: string;
  doc: string;
  /** The `// --- Section ---` line above it, when it is the first of its section. */
  section: string | undefined;
}

/** The table's exported constants in the order limits.ts declares them (a module namespace sorts its names). */
export function tableEntries(sourceText: string): TableEntry[] {
  const file = ts.createSourceFile("limits.ts", sourceText, ts.ScriptTarget.ES2022, true);
  const entries: TableEntry[] = [];
  for (const statement of file.statements) {
    if (!ts.isVariableStatement(statement)) continue;
    const exported = statement.modifiers?.some((m) => m.kind === ts.SyntaxKind.ExportKeyword) ?? false;
    if (!exported) continue;
    const doc = ts
      .getJSDocCommentsAndTags(statement.declarationList.declarations[0] as ts.Node)
      .filter(ts.isJSDoc)
      .map((jsdoc) => ts.getTextOfJSDocComment(jsdoc.comment) ?? "")
      .join(" ")
      .replace(/\s+/g, " ")
      .trim();
    const leading = ts.getLeadingCommentRanges(sourceText, statement.getFullStart()) ?? [];
    const sectionComment = leading
      .map((range) => sourceText.slice(range.pos, range.end))
      .find((text) => text.startsWith("// ---"));
    const section = sectionComment?.replace(/^\/\/ -+ */, "").replace(/ *-+$/, "");
    for (const declaration of statement.declarationList.declarations) {
      if (ts.isIdentifier(declaration.name)) entries.push({ name: declaration.name.text, doc, section });
    }
  }
  return entries;
}

/**
 * A pattern as Python must read it, or an error naming what differs. Allowed: literal characters, escaped
 * punctuation, character classes of literal ranges, groups `(...)`/`(?:...)`, `|`, `?`, `*`, `+`, `{m,n}`, and `^`
 * / `$` at the ends (Python's `$` also matches before a final newline, so the SDK matches with `re.fullmatch`).
 */
export function pythonPattern(pattern: string): string {
  const refuse = (what: string) => {
    throw new Error(`pattern ${JSON.stringify(pattern)} cannot be translated to Python: ${what}`);
  };
  if (!pattern.startsWith("^") || !pattern.endsWith("$")) refuse("it is not anchored with ^...$");
  const body = pattern.slice(1, -1);
  let inClass = false;
  let depth = 0;
  for (let i = 0; i < body.length; i++) {
    const c = body[i] as string;
    if (/[^\x20-\x7e]/.test(c)) refuse("a non-ASCII character");
    if (c === "\\") {
      const next = body[i + 1] ?? "";
      if (!/[.\-/\\()[\]{}?*+|^$:]/.test(next))
        refuse(`the escape \\${next} (Python's differs or is Unicode-aware)`);
      i++;
    } else if (inClass) {
      if (c === "]") inClass = false;
      else if (c === "[") refuse("a nested '[' in a class");
    } else if (c === "[") inClass = true;
    else if (c === "(") {
      if (body[i + 1] === "?" && body[i + 2] !== ":") refuse("a lookaround or a named group");
      depth++;
    } else if (c === ")") depth--;
    else if (c === "|" && depth === 0)
      refuse("'|' outside a group (JavaScript's test() and Python's fullmatch differ)");
    else if (c === ".") refuse("'.' outside a class (it matches line ends differently)");
    else if (c === "^" || c === "$") refuse(`'${c}' inside the pattern`);
  }
  if (inClass) refuse("an unclosed class");
  return pattern;
}

function pythonString(text: string): string {
  if (/[^\x20-\x7e]/.test(text))
    throw new Error(`${JSON.stringify(text)}: only printable ASCII is generated`);
  return JSON.stringify(text);
}

function pythonConstant(name: string, value: unknown): string {
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) throw new Error(`${name}: only integers are generated, got ${value}`);
    return `${name}: Final[int] = ${value}`;
  }
  if (typeof value === "string") {
    const text = name.endsWith("_PATTERN") ? pythonPattern(value) : value;
    return `${name}: Final[str] = ${pythonString(text)}`;
  }
  if (Array.isArray(value) && value.every((v) => typeof v === "string")) {
    const items = value.map(pythonString);
    return `${name}: Final[Tuple[str, ...]] = (${items.join(", ")}${items.length === 1 ? "," : ""})`;
  }
  if (
    typeof value === "object" &&
    value !== null &&
    Object.values(value).every((v) => typeof v === "number")
  ) {
    const entries = Object.entries(value).map(([key, v]) => `        ${pythonString(key)}: ${v},`);
    return `${name}: Final[Mapping[str, int]] = MappingProxyType(\n    {\n${entries.join("\n")}\n    }\n)`;
  }
  throw new Error(`${name}: no Python form for ${JSON.stringify(value)}`);
}

/** Wraps a doc comment into `#:` lines (Sphinx's doc-comment form) of at most 118 characters. */
function docLines(doc: string): string[] {
  if (doc === "") return [];
  const lines: string[] = [];
  let line = "#:";
  for (const word of doc.split(" ")) {
    if (line.length + 1 + word.length > 118 && line !== "#:") {
      lines.push(line);
      line = "#:";
    }
    line += ` ${word}`;
  }
  lines.push(line);
  return lines;
}

/** The text of sdk/python/forkd/_limits.py for the current table. */
export function renderPythonLimits(sourceText = readFileSync(LIMITS_SOURCE, "utf8")): string {
  const entries = tableEntries(sourceText);
  const values = limits as Record<string, unknown>;
  const declared = new Set(entries.map((e) => e.name));
  const missing = Object.keys(values).filter((name) => !declared.has(name));
  if (missing.length > 0) throw new Error(`limits.ts exports ${missing.join(", ")} other than as a const`);
  const blocks = entries.map(({ name, doc, section }) => {
    const heading = section === undefined ? [] : [`# --- ${section}`, ""];
    return [...heading, ...docLines(doc), pythonConstant(name, values[name])].join("\n");
  });
  return [
    '"""forkd\'s limits and names, shared with the daemon and the TypeScript SDK.',
    "",
    "GENERATED from src/common/limits.ts by `npm run limits:python`: do not edit (a test fails when it is stale).",
    "Durations are milliseconds unless a name says otherwise; patterns are meant for ``re.fullmatch``.",
    '"""',
    "",
    "from types import MappingProxyType",
    "from typing import Final, Mapping, Tuple",
    "",
    `__all__ = [\n${entries.map((e) => `    ${pythonString(e.name)},`).join("\n")}\n]`,
    "",
    ...blocks.map((block) => `${block}\n`),
  ].join("\n");
}

if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const text = renderPythonLimits();
  if (process.argv.includes("--check")) {
    const current = (() => {
      try {
        return readFileSync(PYTHON_LIMITS, "utf8");
      } catch {
        return "";
      }
    })();
    if (current !== text) {
      process.stderr.write(`${PYTHON_LIMITS} is stale: run \`npm run limits:python\`\n`);
      process.exit(1);
    }
    process.stdout.write(`${PYTHON_LIMITS} is up to date\n`);
  } else {
    const temp = `${PYTHON_LIMITS}.tmp-${process.pid}`;
    writeFileSync(temp, text);
    renameSync(temp, PYTHON_LIMITS);
    process.stdout.write(`wrote ${PYTHON_LIMITS}\n`);
  }
}
