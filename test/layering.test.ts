/**
 * The architecture, checked: one table says what each folder of src/ may import (forkd folders or files, npm
 * packages; Node's `node:` modules everywhere), and
 * - every import of every source file, type-only ones included, is allowed by its folder's row (the failure names
 *   the file and the import);
 * - every folder with sources has a row, and each row is what the folder's README says under "May import" (the
 *   same forkd folders and files, every package named);
 * - no import cycle exists between source files, type-only imports included (the failure names the cycle).
 * Imports are read with TypeScript's own parser (ts.preProcessFile), never with regular expressions.
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const here = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(here, here.includes(`${path.sep}dist${path.sep}`) ? "../../src" : "../src");

interface Layer {
  /** The README that states the rule, and the line its "May import" paragraph starts with. */
  readme: string;
  marker?: string;
  /** forkd folders (their whole tree) or single files, relative to src/. */
  forkd: string[];
  /** npm packages (the name, without a subpath). */
  packages: string[];
}

/** What each folder of src/ may import. Keep in step with the folders' READMEs (the test compares them). */
const LAYERS: Record<string, Layer> = {
  common: { readme: "common/README.md", forkd: [], packages: [] },
  "agent/protocol": {
    readme: "agent/README.md",
    marker: "- `protocol/`",
    forkd: ["common"],
    packages: ["@sinclair/typebox"],
  },
  "agent/host": {
    readme: "agent/README.md",
    marker: "- `host/`",
    forkd: ["agent/protocol", "common"],
    packages: [],
  },
  isolation: { readme: "isolation/README.md", forkd: ["common"], packages: [] },
  vmm: { readme: "vmm/README.md", forkd: ["common"], packages: ["koffi"] },
  store: {
    readme: "store/README.md",
    forkd: ["common"],
    packages: ["better-sqlite3", "tar", "@sinclair/typebox"],
  },
  image: {
    readme: "image/README.md",
    forkd: ["common", "isolation/identity.ts"],
    packages: ["smol-toml", "@sinclair/typebox", "tar"],
  },
  net: {
    readme: "net/README.md",
    forkd: ["common", "isolation"],
    packages: ["dns-packet", "http-proxy-3", "ipaddr.js"],
  },
  cluster: { readme: "cluster/README.md", forkd: ["common"], packages: ["@sinclair/typebox"] },
  controller: {
    readme: "controller/README.md",
    forkd: ["common", "store", "vmm", "image", "agent/host", "agent/protocol", "net", "isolation"],
    packages: [],
  },
  "controller/machines": {
    readme: "controller/machines/README.md",
    forkd: ["common", "store", "vmm", "image", "agent/host", "isolation", "controller/networks"],
    packages: [],
  },
  "controller/networks": {
    readme: "controller/networks/README.md",
    forkd: ["common", "net", "store", "vmm", "isolation"],
    packages: [],
  },
  "controller/host": {
    readme: "controller/host/README.md",
    forkd: [
      "common",
      "vmm",
      "image",
      "net",
      "isolation",
      "controller/machines",
      "controller/networks",
      "controller/sandbox-service.ts",
    ],
    packages: ["koffi"],
  },
  "controller/snapshots": {
    readme: "controller/snapshots/README.md",
    forkd: [
      "common",
      "store",
      "vmm",
      "image",
      "net",
      "isolation",
      "controller/machines",
      "controller/host",
      "controller/networks",
      "controller/sandbox-service.ts",
    ],
    packages: ["@sinclair/typebox"],
  },
  "controller/sandboxes": {
    readme: "controller/sandboxes/README.md",
    forkd: [
      "common",
      "store",
      "vmm",
      "agent/host",
      "net",
      "isolation",
      "controller/snapshots",
      "controller/builds",
      "controller/host",
      "controller/machines",
      "controller/networks",
      "controller/sandbox-service.ts",
    ],
    packages: [],
  },
  "controller/builds": {
    readme: "controller/builds/README.md",
    forkd: ["common", "controller/snapshots"],
    packages: ["tar", "smol-toml"],
  },
  "controller/tenancy": {
    readme: "controller/tenancy/README.md",
    forkd: [
      "common",
      "controller/sandbox-service.ts",
      "controller/snapshots/template-aliases.ts",
      "controller/builds/contract.ts",
    ],
    packages: [],
  },
  e2b: {
    readme: "e2b/README.md",
    forkd: [
      "common",
      "http",
      "controller/sandbox-service.ts",
      "controller/tenancy",
      "controller/sandboxes/settings.ts",
      "controller/snapshots/template-aliases.ts",
      "controller/builds/contract.ts",
      "agent/host",
      "agent/protocol",
    ],
    packages: [
      "fastify",
      "@fastify/multipart",
      "@sinclair/typebox",
      "@connectrpc/connect",
      "@connectrpc/connect-fastify",
      "@bufbuild/protobuf",
    ],
  },
  api: {
    readme: "api/README.md",
    forkd: [
      "common",
      "http",
      "controller/sandbox-service.ts",
      "controller/tenancy",
      "controller/snapshots/branch.ts",
      "controller/sandboxes/spawn-observer.ts",
      "e2b",
      "agent/host",
      "agent/protocol",
    ],
    packages: ["fastify", "@fastify/swagger", "@sinclair/typebox", "pino", "prom-client", "koffi"],
  },
  http: {
    readme: "http/README.md",
    forkd: [
      "common",
      "controller/tenancy",
      "controller/sandbox-service.ts",
      "controller/sandboxes/spawn-observer.ts",
    ],
    packages: ["fastify"],
  },
  console: {
    readme: "console/README.md",
    forkd: [
      "common",
      "http",
      "api",
      "controller/sandbox-service.ts",
      "controller/tenancy",
      "agent/host",
      "agent/protocol",
    ],
    packages: ["fastify", "@sinclair/typebox", "cookie", "prom-client", "ws"],
  },
  sdk: { readme: "sdk/README.md", forkd: ["common/limits.ts"], packages: [] },
  mcp: {
    readme: "mcp/README.md",
    forkd: ["sdk/index.ts", "common/limits.ts"],
    packages: ["@modelcontextprotocol/sdk", "zod"],
  },
  kube: {
    readme: "kube/README.md",
    forkd: ["common", "cluster"],
    packages: ["@kubernetes/client-node"],
  },
  "cluster-node": {
    readme: "cluster-node/README.md",
    forkd: [
      "common",
      "cluster",
      "kube",
      "api/extensions.ts",
      "api/front.ts",
      "api/ndjson.ts",
      "http",
      "controller/sandbox-service.ts",
      "controller/tenancy",
    ],
    packages: ["@sinclair/typebox", "fastify", "pino"],
  },
  gateway: {
    readme: "gateway/README.md",
    forkd: ["common", "cluster", "kube", "api", "e2b", "mcp/http.ts", "sdk/index.ts"],
    packages: ["@sinclair/typebox", "fastify", "http-proxy-3", "pino"],
  },
  "cluster-controller": {
    readme: "cluster-controller/README.md",
    forkd: ["common", "cluster", "kube", "api/listen.ts", "sdk/index.ts"],
    packages: ["@kubernetes/client-node", "pino"],
  },
  "local-cluster": {
    readme: "local-cluster/README.md",
    forkd: ["common", "cluster"],
    packages: ["@kubernetes/client-node"],
  },
  cli: {
    readme: "cli/README.md",
    forkd: [
      "common",
      "controller",
      "api",
      "console",
      "mcp",
      "sdk/index.ts",
      "image/index.ts",
      "isolation/confinement.ts",
      "vmm/console-log.ts",
      "cluster/api-group.ts",
      "cluster-node",
      "gateway",
      "cluster-controller",
      "kube/config.ts",
    ],
    packages: ["commander", "ora", "pino", "http-proxy-3", "@sinclair/typebox"],
  },
};

/** Source files relative to src/ (TypeScript; generated code included: it imports like the rest). */
function sourceFiles(): string[] {
  return readdirSync(SRC, { recursive: true })
    .map(String)
    .filter((f) => /\.tsx?$/.test(f) && !f.endsWith(".d.ts"))
    .map((f) => f.split(path.sep).join("/"))
    .sort();
}

/** The row a file belongs to: the longest folder of the table that contains it. */
function layerOf(file: string): string | undefined {
  let best: string | undefined;
  for (const name of Object.keys(LAYERS)) {
    if (file.startsWith(`${name}/`) && (best === undefined || name.length > best.length)) best = name;
  }
  return best;
}

interface Import {
  specifier: string;
  /** The imported file relative to src/, for a relative import. */
  target?: string;
}

function importsOf(file: string): Import[] {
  const text = readFileSync(path.join(SRC, file), "utf8");
  return ts.preProcessFile(text, true, true).importedFiles.map(({ fileName: specifier }) => {
    if (!specifier.startsWith(".")) return { specifier };
    const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(file), specifier));
    return { specifier, target: resolved.replace(/\.js$/, ".ts") };
  });
}

function packageOf(specifier: string): string {
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : (parts[0] as string);
}

const covers = (allowed: string, target: string) => target === allowed || target.startsWith(`${allowed}/`);

describe("layering", () => {
  const files = sourceFiles();

  it("finds the sources", () => {
    assert.ok(files.includes("sdk/index.ts") && files.includes("common/limits.ts"), `sources under ${SRC}`);
  });

  it("gives every folder of src/ a row of the table", () => {
    const folders = [...new Set(files.map((f) => path.posix.dirname(f)))];
    assert.deepEqual(
      folders.filter((folder) => layerOf(`${folder}/x.ts`) === undefined),
      [],
      "folders with sources but no row in LAYERS (test/layering.test.ts) nor a README saying what they may import",
    );
  });

  it("allows every import of every file by its folder's row", () => {
    const offenders: string[] = [];
    for (const file of files) {
      const name = layerOf(file);
      if (name === undefined) continue;
      const layer = LAYERS[name] as Layer;
      for (const { specifier, target } of importsOf(file)) {
        if (target === undefined) {
          if (specifier.startsWith("node:") || layer.packages.includes(packageOf(specifier))) continue;
          offenders.push(
            `src/${file}: import "${specifier}" (${name} may not import the package ${packageOf(specifier)})`,
          );
          continue;
        }
        if (target.startsWith("../")) {
          offenders.push(`src/${file}: import "${specifier}" reaches outside src/`);
          continue;
        }
        if (layerOf(target) === name || covers(name, target)) continue;
        if (layer.forkd.some((allowed) => covers(allowed, target))) continue;
        offenders.push(`src/${file}: import "${specifier}" (${name} may not import src/${target})`);
      }
    }
    assert.deepEqual(offenders, [], "imports the layering table does not allow");
  });

  it("states each row in its folder's README under May import", () => {
    const mismatches: string[] = [];
    for (const [name, layer] of Object.entries(LAYERS)) {
      const readme = readFileSync(path.join(SRC, layer.readme), "utf8");
      const paragraph = mayImportParagraph(readme, layer.marker);
      if (paragraph === undefined) {
        mismatches.push(
          `src/${layer.readme}: no "May import" paragraph${layer.marker ? ` at ${layer.marker}` : ""}`,
        );
        continue;
      }
      const said = mentionedFolders(paragraph, path.posix.dirname(layer.readme), name);
      const missing = layer.forkd.filter((f) => !said.has(f));
      const extra = [...said].filter((f) => !layer.forkd.includes(f));
      const unnamed = layer.packages.filter((p) => !paragraph.includes(p));
      if (missing.length > 0)
        mismatches.push(`src/${layer.readme} (${name}) does not name ${missing.join(", ")}`);
      if (extra.length > 0)
        mismatches.push(`src/${layer.readme} (${name}) names ${extra.join(", ")}, not in LAYERS`);
      if (unnamed.length > 0)
        mismatches.push(`src/${layer.readme} (${name}) does not name ${unnamed.join(", ")}`);
    }
    assert.deepEqual(mismatches, [], "README May import lines that differ from the layering table");
  });

  it("has no import cycle, type-only imports included", () => {
    const graph = new Map<string, Import[]>();
    for (const file of files) {
      graph.set(
        file,
        importsOf(file).filter((i) => i.target !== undefined && files.includes(i.target)),
      );
    }
    assert.deepEqual(findCycles(graph), [], "import cycles (each: file -> import -> ... -> back)");
  });
});

/** The "May import:" paragraph (to "Imported by", "Never", a blank line or the next bullet), or the one at `marker`. */
function mayImportParagraph(readme: string, marker: string | undefined): string | undefined {
  const start = marker === undefined ? readme.indexOf("May import:") : readme.indexOf(marker);
  if (start === -1) return undefined;
  const rest = readme.slice(start + (marker ?? "May import:").length);
  const end = rest.search(/\n\s*\n|\n- |Imported by|(?:^|[.;:]\s+)Never\b|Nothing (?:outside|else)/);
  return end === -1 ? rest : rest.slice(0, end);
}

/** The forkd folders and files a paragraph names: `src/x[/y][.ts]` and, in src/a/b's README, `../c`. */
function mentionedFolders(paragraph: string, readmeDir: string, self: string): Set<string> {
  const found = new Set<string>();
  for (const match of paragraph.matchAll(/(?<![\w/.])(?:src\/|\.\.\/)[A-Za-z0-9_.\-/]*[A-Za-z0-9_]/g)) {
    const text = match[0];
    const name = text.startsWith("src/")
      ? text.slice("src/".length)
      : path.posix.normalize(path.posix.join(readmeDir, text));
    if (name !== self) found.add(name.replace(/\/$/, ""));
  }
  return found;
}

/** Every strongly connected set of files, each written as one cycle through it with the imports taken. */
function findCycles(graph: Map<string, Import[]>): string[] {
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const cycles: string[] = [];
  const visit = (file: string) => {
    index.set(file, counter);
    low.set(file, counter);
    counter++;
    stack.push(file);
    onStack.add(file);
    for (const { target } of graph.get(file) ?? []) {
      const next = target as string;
      if (!index.has(next)) {
        visit(next);
        low.set(file, Math.min(low.get(file) as number, low.get(next) as number));
      } else if (onStack.has(next)) {
        low.set(file, Math.min(low.get(file) as number, index.get(next) as number));
      }
    }
    if (low.get(file) !== index.get(file)) return;
    const component = new Set<string>();
    for (let member = stack.pop(); ; member = stack.pop()) {
      onStack.delete(member as string);
      component.add(member as string);
      if (member === file) break;
    }
    const selfImport = (graph.get(file) ?? []).some((i) => i.target === file);
    if (component.size > 1 || selfImport) cycles.push(describeCycle(graph, file, component));
  };
  for (const file of graph.keys()) if (!index.has(file)) visit(file);
  return cycles;
}

/** A path from `start` back to itself inside `component`, naming each import: a.ts "./b.js" -> b.ts ... */
function describeCycle(graph: Map<string, Import[]>, start: string, component: Set<string>): string {
  const previous = new Map<string, { from: string; specifier: string }>();
  const queue = [start];
  while (queue.length > 0) {
    const file = queue.shift() as string;
    for (const { target, specifier } of graph.get(file) ?? []) {
      if (target === undefined || !component.has(target)) continue;
      if (target === start) {
        const steps = [`src/${file} imports "${specifier}" (src/${start})`];
        for (let at = file; at !== start; ) {
          const step = previous.get(at) as { from: string; specifier: string };
          steps.unshift(`src/${step.from} imports "${step.specifier}"`);
          at = step.from;
        }
        return `${steps.join(" -> ")} [${component.size} files in the cycle]`;
      }
      if (!previous.has(target)) {
        previous.set(target, { from: file, specifier });
        queue.push(target);
      }
    }
  }
  return `src/${start} (cycle of ${[...component].join(", ")})`;
}
