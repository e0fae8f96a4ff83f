/**
 * What a networked build step is given so the image's own pip, npm and apt install from the package indexes this
 * machine is configured to use, as the host's own tools would: the host's pip configuration (`pip config list`:
 * index-url, extra-index-url, trusted-host, proxy, timeouts), npm's (`npm config get`: registry, proxies, strict-ssl),
 * apt's sources and proxies, and the CA bundle those tools trust (pip's `cert`, npm's `cafile`, else OpenSSL's).
 * forkd names no index, mirror or host of its own: a machine with no configuration gives the tools' own defaults.
 *
 * Nothing here changes the image: the configuration reaches the step as environment variables and read-only
 * files under SANDBOX_INPUTS (an APT_CONFIG file pointing apt at copies of the host's sources and keyrings), so
 * the image keeps its own configuration for its sandboxes. Which hosts the step can reach at all is the step
 * network's business (step-sandbox.ts); this module only tells the tools where to go.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { enabledAptSources, resolveInRoot } from "./rootfs.js";
import { runText } from "./run.js";

/** The host's configuration is read again after this long (a changed pip.conf or sources list is picked up). */
const CACHE_MS = 60_000;
const TOOL_TIMEOUT_MS = 20_000;
/** Name of the input directory a step sees at `${SANDBOX_INPUTS}/packages`. */
export const PACKAGE_INPUT = "packages";

/** pip options passed through (`PIP_<NAME>`); host paths (find-links directories, a client cert) are not. */
const PIP_KEYS = new Set([
  "index-url",
  "extra-index-url",
  "trusted-host",
  "proxy",
  "timeout",
  "default-timeout",
  "retries",
]);
const NPM_KEYS = ["registry", "proxy", "https-proxy", "strict-ssl"] as const;
const PROXY_VARIABLES = ["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"];
/** Variables tools read a CA bundle from (OpenSSL, Python requests, curl, Node, git, pip, npm). */
const CA_VARIABLES = [
  "SSL_CERT_FILE",
  "REQUESTS_CA_BUNDLE",
  "CURL_CA_BUNDLE",
  "NODE_EXTRA_CA_CERTS",
  "GIT_SSL_CAINFO",
  "PIP_CERT",
  "NPM_CONFIG_CAFILE",
];

export interface HostPackageConfig {
  /** PIP_* variables from the host's pip configuration. */
  pip: Record<string, string>;
  /** NPM_CONFIG_* variables from the host's npm configuration (registry always, when npm is installed). */
  npm: Record<string, string>;
  /** The CA bundle the host's pip/npm/OpenSSL trust (a host file), if any. */
  caBundle: string | undefined;
  /** The host's apt sources files, its distribution and codename, its Acquire proxies. */
  apt: { sources: string[]; id: string; codename: string; proxies: Record<string, string> } | undefined;
  /** Proxy variables of this process's environment. */
  proxies: Record<string, string>;
}

let cached: { at: number; config: Promise<HostPackageConfig> } | undefined;

/** The machine's package configuration (read at most once a minute). */
export function hostPackageConfig(): Promise<HostPackageConfig> {
  if (!cached || Date.now() - cached.at > CACHE_MS) {
    const config = readHostConfig();
    cached = { at: Date.now(), config };
    config.catch(() => {
      cached = undefined;
    });
  }
  return cached.config;
}

async function tool(command: string, args: string[]): Promise<string | undefined> {
  return runText(command, args, {
    signal: AbortSignal.timeout(TOOL_TIMEOUT_MS),
    label: `${command} ${args.join(" ")}`.slice(0, 80),
    maxStdoutBytes: 1024 * 1024,
    tailBytes: 0,
  }).catch(() => undefined);
}

/** `pip config list` lines (`global.index-url='https://...'`, `:env:.timeout='60'`) to PIP_* variables. */
export function pipVariables(text: string): { env: Record<string, string>; cert: string | undefined } {
  const env: Record<string, string> = {};
  let cert: string | undefined;
  for (const line of text.split("\n")) {
    const match = /^[^=]*\.([a-z-]+)='(.*)'$/.exec(line.trim());
    if (!match) continue;
    const [, key, value] = match as unknown as [string, string, string];
    if (key === "cert") cert = value;
    else if (PIP_KEYS.has(key)) env[`PIP_${key.toUpperCase().replaceAll("-", "_")}`] = value;
  }
  return { env, cert };
}

/** `npm config get registry proxy https-proxy strict-ssl cafile` (`key=value`, `null` when unset). */
export function npmVariables(text: string): { env: Record<string, string>; cafile: string | undefined } {
  const env: Record<string, string> = {};
  let cafile: string | undefined;
  for (const line of text.split("\n")) {
    const match = /^([a-z-]+)=(.*)$/.exec(line.trim());
    if (!match) continue;
    const [, key, value] = match as unknown as [string, string, string];
    if (value === "" || value === "null" || value === "undefined") continue;
    if (key === "cafile") cafile = value;
    else if ((NPM_KEYS as readonly string[]).includes(key)) {
      env[`NPM_CONFIG_${key.toUpperCase().replaceAll("-", "_")}`] = value;
    }
  }
  return { env, cafile };
}

/** KEY=value lines of an os-release file (quotes removed). */
export function parseOsRelease(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const match = /^([A-Z_]+)=(.*)$/.exec(line.trim());
    if (match) out[match[1] as string] = (match[2] as string).replace(/^["']|["']$/g, "");
  }
  return out;
}

async function readHostConfig(): Promise<HostPackageConfig> {
  const [pipText, npmText, opensslDir, aptProxies, osRelease, sources] = await Promise.all([
    tool("python3", ["-m", "pip", "config", "list"]),
    tool("npm", ["config", "get", ...NPM_KEYS, "cafile"]),
    tool("openssl", ["version", "-d"]),
    tool("apt-config", ["dump", "--format", "%f=%v%n", "Acquire::http::Proxy", "Acquire::https::Proxy"]),
    fs.readFile("/etc/os-release", "utf8").catch(() => ""),
    enabledAptSources(),
  ]);
  const pip = pipVariables(pipText ?? "");
  const npm = npmVariables(npmText ?? "");
  const opensslBundle = /OPENSSLDIR: "([^"]+)"/.exec(opensslDir ?? "")?.[1];
  const candidates = [pip.cert, npm.cafile, opensslBundle && path.join(opensslBundle, "cert.pem")];
  let caBundle: string | undefined;
  for (const candidate of candidates) {
    if (candidate && (await fs.stat(candidate).catch(() => undefined))?.isFile()) {
      caBundle = candidate;
      break;
    }
  }
  const os = parseOsRelease(osRelease);
  const proxies: Record<string, string> = {};
  for (const line of (aptProxies ?? "").split("\n")) {
    const match = /^Acquire::(https?)::Proxy=(\S+)$/.exec(line.trim());
    if (match) proxies[match[1] as string] = match[2] as string;
  }
  const env: Record<string, string> = {};
  for (const name of PROXY_VARIABLES) {
    const value = process.env[name];
    if (value) env[name] = value;
  }
  return {
    pip: pip.env,
    npm: npm.env,
    caBundle,
    apt:
      sources.length > 0 && os.ID
        ? { sources, id: os.ID, codename: os.VERSION_CODENAME ?? "", proxies }
        : undefined,
    proxies: env,
  };
}

/**
 * A host sources file rewritten for an image of the same distribution on `codename`: the host's codename in
 * suites (`bookworm`, `bookworm-updates`, `bookworm-security`) becomes the image's, and every keyring it names
 * (`Signed-By:`, `[signed-by=...]`) becomes `keyringDir/<its name>`. Returns the text and the keyrings named.
 */
export function rewriteSources(
  text: string,
  hostCodename: string,
  codename: string,
  keyringDir: string,
): { text: string; keyrings: string[] } {
  const keyrings: string[] = [];
  const keyring = (file: string) => {
    keyrings.push(file);
    return path.posix.join(keyringDir, path.basename(file));
  };
  const suite = (s: string) =>
    hostCodename !== "" && codename !== "" && (s === hostCodename || s.startsWith(`${hostCodename}-`))
      ? codename + s.slice(hostCodename.length)
      : s;
  const lines = text.split("\n").map((line) => {
    const deb822Suites = /^(\s*Suites:\s*)(.*)$/i.exec(line);
    if (deb822Suites) return deb822Suites[1] + (deb822Suites[2] as string).split(/\s+/).map(suite).join(" ");
    const signedBy = /^(\s*Signed-By:\s*)(\/\S+)\s*$/i.exec(line);
    if (signedBy) return signedBy[1] + keyring(signedBy[2] as string);
    const oneLine = /^(\s*deb(?:-src)?\s+)(\[[^\]]*\]\s+)?(\S+)\s+(\S+)(.*)$/.exec(line);
    if (oneLine) {
      const options = (oneLine[2] ?? "").replace(
        /signed-by=(\/[^\s\]]+)/g,
        (_m, file: string) => `signed-by=${keyring(file)}`,
      );
      return `${oneLine[1]}${options}${oneLine[3]} ${suite(oneLine[4] as string)}${oneLine[5]}`;
    }
    return line;
  });
  return { text: lines.join("\n"), keyrings };
}

export interface StepPackageEnvironment {
  /** Variables the step gets on top of the image's (its tools find the host's indexes through them). */
  env: Record<string, string>;
  /** The directory to bind read-only at `${SANDBOX_INPUTS}/packages`. */
  inputDir: string;
  /** For the build log: what the step's tools were pointed at. */
  notes: string[];
}

/**
 * Writes the configuration a networked step in the image at `root` gets into `dir` (a fresh directory of the
 * build's staging area) and returns its environment; `inputsPath` is where the step sees `dir`.
 */
export async function stepPackageEnvironment(
  root: string,
  dir: string,
  inputsPath: string,
  config?: HostPackageConfig,
): Promise<StepPackageEnvironment> {
  const host = config ?? (await hostPackageConfig());
  await fs.mkdir(dir, { recursive: true, mode: 0o755 });
  const env: Record<string, string> = { ...host.proxies, ...host.pip, ...host.npm };
  const notes: string[] = [];
  if (host.pip.PIP_INDEX_URL) notes.push(`pip index ${host.pip.PIP_INDEX_URL}`);
  if (host.npm.NPM_CONFIG_REGISTRY) notes.push(`npm registry ${host.npm.NPM_CONFIG_REGISTRY}`);
  if (host.caBundle) {
    await fs.copyFile(host.caBundle, path.join(dir, "ca-certificates.crt"));
    for (const name of CA_VARIABLES) env[name] = path.posix.join(inputsPath, "ca-certificates.crt");
    notes.push("the host's CA bundle");
  }
  const apt = await aptEnvironment(root, dir, inputsPath, host);
  if (apt) {
    env.APT_CONFIG = apt.config;
    notes.push(apt.note);
  }
  return { env, inputDir: dir, notes };
}

async function aptEnvironment(
  root: string,
  dir: string,
  inputsPath: string,
  host: HostPackageConfig,
): Promise<{ config: string; note: string } | undefined> {
  if (!host.apt) return undefined;
  const release = await fs
    .readFile(await resolveInRoot(root, "/etc/os-release", true), "utf8")
    .catch(async () =>
      fs.readFile(await resolveInRoot(root, "/usr/lib/os-release", true), "utf8").catch(() => ""),
    );
  const image = parseOsRelease(release);
  // Another distribution's packages are not in the host's archive: its own sources stay.
  if (image.ID !== host.apt.id) return undefined;
  const codename = image.VERSION_CODENAME ?? host.apt.codename;
  const aptDir = path.join(dir, "apt");
  await fs.mkdir(path.join(aptDir, "sources.list.d"), { recursive: true, mode: 0o755 });
  await fs.mkdir(path.join(aptDir, "keyrings"), { recursive: true, mode: 0o755 });
  const inside = path.posix.join(inputsPath, "apt");
  for (const [i, file] of host.apt.sources.entries()) {
    const text = await fs.readFile(file, "utf8");
    const rewritten = rewriteSources(text, host.apt.codename, codename, path.posix.join(inside, "keyrings"));
    const name = `${String(i).padStart(2, "0")}-${path.basename(file) === "sources.list" ? "host.list" : path.basename(file)}`;
    await fs.writeFile(path.join(aptDir, "sources.list.d", name), rewritten.text, { mode: 0o644 });
    for (const keyring of rewritten.keyrings) {
      await fs
        .copyFile(keyring, path.join(aptDir, "keyrings", path.basename(keyring)))
        .catch(() => undefined);
    }
  }
  const lines = [
    `Dir::Etc::sourcelist "${path.posix.join(inside, "none.list")}";`,
    `Dir::Etc::sourceparts "${path.posix.join(inside, "sources.list.d")}";`,
    ...Object.entries(host.apt.proxies).map(([scheme, url]) => `Acquire::${scheme}::Proxy "${url}";`),
  ];
  await fs.writeFile(path.join(aptDir, "none.list"), "", { mode: 0o644 });
  await fs.writeFile(path.join(aptDir, "apt.conf"), `${lines.join("\n")}\n`, { mode: 0o644 });
  return {
    config: path.posix.join(inside, "apt.conf"),
    note: `apt: the host's sources (${host.apt.id} ${codename})`,
  };
}
