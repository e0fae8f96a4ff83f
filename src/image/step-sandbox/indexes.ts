/**
 * The package indexes this machine is configured to use, read from its own tools' configuration (never a host
 * name of forkd's): pip (`pip config list`: index-url, extra-index-url, find-links URLs, proxy; with no index
 * configured, pip's own default index and the host it serves files from, as pip itself defines them), npm
 * (`npm config get registry proxy https-proxy`), apt (the repositories of `apt-get indextargets` and
 * Acquire::http(s)::Proxy), and the proxy variables of this process's environment. A networked build step
 * reaches these and nothing else (network.ts). A tool that is not installed contributes nothing.
 */
import { ForkdError } from "../../common/errors.js";
import { runText } from "../run.js";

export type IndexSource = "pip" | "npm" | "apt" | "environment";

export interface PackageIndex {
  source: IndexSource;
  /** What it is for ("index-url", "registry", "repository", "proxy", "files"). */
  role: string;
  url: string;
}

/** A host and TCP port a step may connect to. */
export interface IndexEndpoint {
  host: string;
  port: number;
}

/** The configuration is read again after this long (a changed pip.conf or sources list is picked up). */
const CACHE_MS = 60_000;
const TOOL_TIMEOUT_MS = 20_000;

let cached: { at: number; indexes: Promise<PackageIndex[]> } | undefined;

/** The machine's configured indexes (read at most once a minute). */
export function hostPackageIndexes(): Promise<PackageIndex[]> {
  if (!cached || Date.now() - cached.at > CACHE_MS) {
    const indexes = readIndexes();
    cached = { at: Date.now(), indexes };
    indexes.catch(() => {
      cached = undefined;
    });
  }
  return cached.indexes;
}

/** Forgets what was read (tests that change the configuration). */
export function forgetHostPackageIndexes(): void {
  cached = undefined;
}

async function readIndexes(): Promise<PackageIndex[]> {
  const parts = await Promise.all([pipIndexes(), npmIndexes(), aptIndexes()]);
  return dedupe([...parts.flat(), ...environmentProxies(process.env)]);
}

/** The hosts and ports of `indexes` (http 80, https 443 unless the URL says). */
export function indexEndpoints(indexes: readonly PackageIndex[]): IndexEndpoint[] {
  const out = new Map<string, IndexEndpoint>();
  for (const index of indexes) {
    const endpoint = endpointOf(index.url);
    if (endpoint) out.set(`${endpoint.host}:${endpoint.port}`, endpoint);
  }
  return [...out.values()];
}

export function endpointOf(url: string): IndexEndpoint | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined;
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return undefined;
  const host = parsed.hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "") return undefined;
  const port = parsed.port === "" ? (parsed.protocol === "https:" ? 443 : 80) : Number(parsed.port);
  return { host, port };
}

function dedupe(indexes: PackageIndex[]): PackageIndex[] {
  const seen = new Set<string>();
  return indexes.filter((i) => {
    const key = `${i.source} ${i.role} ${i.url}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

async function tool(command: string, args: string[]): Promise<string | undefined> {
  return runText(command, args, {
    signal: AbortSignal.timeout(TOOL_TIMEOUT_MS),
    label: `${command} ${args.join(" ")}`.slice(0, 80),
    maxStdoutBytes: 1024 * 1024,
  }).catch(() => undefined);
}

/** `pip config list` lines: `global.index-url='https://...'` (`:env:.index-url=...` for PIP_* variables). */
export function parsePipConfig(text: string): PackageIndex[] {
  const out: PackageIndex[] = [];
  for (const line of text.split("\n")) {
    const match = /^[^=]*\.([a-z-]+)='(.*)'$/.exec(line.trim());
    if (!match) continue;
    const [, key, value] = match as unknown as [string, string, string];
    if (key === "index-url" || key === "extra-index-url" || key === "find-links" || key === "proxy") {
      for (const url of value.split(/\s+/)) {
        if (/^https?:\/\//.test(url)) out.push({ source: "pip", role: key, url });
      }
    }
  }
  return out;
}

async function pipIndexes(): Promise<PackageIndex[]> {
  const config = await tool("python3", ["-m", "pip", "config", "list"]);
  if (config === undefined) return [];
  const configured = parsePipConfig(config);
  const out = [...configured];
  // pip's own default, from pip itself: its index, and the host that index serves the files from.
  const defaults = await tool("python3", [
    "-c",
    "from pip._internal.models.index import PyPI; print(PyPI.simple_url); print(PyPI.file_storage_domain)",
  ]);
  const [simpleUrl, filesHost] = (defaults ?? "").trim().split("\n");
  if (simpleUrl && /^https?:\/\//.test(simpleUrl)) {
    const defaultHost = endpointOf(simpleUrl)?.host;
    const usesDefault =
      !configured.some((i) => i.role === "index-url") ||
      configured.some((i) => i.role.endsWith("index-url") && endpointOf(i.url)?.host === defaultHost);
    if (usesDefault) {
      out.push({ source: "pip", role: "index-url", url: simpleUrl });
      if (filesHost && /^[a-z0-9.-]+$/i.test(filesHost))
        out.push({ source: "pip", role: "files", url: `https://${filesHost}/` });
    }
  }
  return out;
}

/** `npm config get registry proxy https-proxy` output: `key=value` lines (`null` when unset). */
export function parseNpmConfig(text: string): PackageIndex[] {
  const out: PackageIndex[] = [];
  for (const line of text.split("\n")) {
    const match = /^(registry|proxy|https-proxy)=(\S+)$/.exec(line.trim());
    if (!match || !/^https?:\/\//.test(match[2] as string)) continue;
    out.push({
      source: "npm",
      role: match[1] === "registry" ? "registry" : "proxy",
      url: match[2] as string,
    });
  }
  return out;
}

async function npmIndexes(): Promise<PackageIndex[]> {
  const text = await tool("npm", ["config", "get", "registry", "proxy", "https-proxy"]);
  return text === undefined ? [] : parseNpmConfig(text);
}

async function aptIndexes(): Promise<PackageIndex[]> {
  const repos = await tool("apt-get", ["indextargets", "--no-release-info", "--format", "$(REPO_URI)"]);
  const out: PackageIndex[] = [];
  for (const url of new Set((repos ?? "").split("\n").map((l) => l.trim()))) {
    if (/^https?:\/\//.test(url)) out.push({ source: "apt", role: "repository", url });
  }
  for (const key of ["Acquire::http::Proxy", "Acquire::https::Proxy"]) {
    const value = (await tool("apt-config", ["dump", "--format", "%v%n", key]))?.trim();
    if (value && /^https?:\/\//.test(value)) out.push({ source: "apt", role: "proxy", url: value });
  }
  return out;
}

/** The proxy variables a host tool would use (a networked step is given them too). */
export function environmentProxies(env: NodeJS.ProcessEnv): PackageIndex[] {
  const out: PackageIndex[] = [];
  for (const name of ["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"]) {
    const value = env[name];
    if (value && /^https?:\/\//.test(value)) out.push({ source: "environment", role: "proxy", url: value });
  }
  return out;
}

/** For messages: "pip index-url https://..., npm registry https://...". */
export function describeIndexes(indexes: readonly PackageIndex[]): string {
  if (indexes.length === 0) return "none (no pip, npm or apt index is configured on this host)";
  return indexes.map((i) => `${i.source} ${i.role} ${i.url}`).join(", ");
}

/**
 * Refuses an index URL a step names (a `pip` step's `index`) that is not one of the machine's configured
 * indexes: the step could not reach it.
 */
export async function assertConfiguredIndex(url: string, what: string): Promise<void> {
  const wanted = endpointOf(url);
  const indexes = await hostPackageIndexes();
  const ok =
    wanted !== undefined &&
    indexEndpoints(indexes).some((e) => e.host === wanted.host && e.port === wanted.port);
  if (!ok) {
    throw new ForkdError(
      "invalid_argument",
      `${what} ${url} is not one of this machine's configured package indexes, the only ones a build step ` +
        `reaches: ${describeIndexes(indexes)} (configure it in the host's pip configuration, e.g. PIP_INDEX_URL or pip.conf)`,
    );
  }
}
