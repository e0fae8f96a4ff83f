/**
 * The host's Debian release and the boot packages (kernel, busybox) as the host's own apt configuration
 * resolves them. No mirror is ever named here: apt-cache and apt-get use whatever sources the machine has.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { run, runText } from "./run.js";

export interface HostDistro {
  /** Debian codename of the host (e.g. "bookworm"), the suite guest root filesystems are built from. */
  suite: string;
  /** Debian architecture name (e.g. "amd64"). */
  arch: string;
}

export interface BootPackages {
  /** The versioned kernel package the `linux-image-<arch>` metapackage depends on. */
  kernelPackage: string;
  kernelVersion: string;
  busyboxVersion: string;
}

const PACKAGE_NAME = /^[a-z0-9][a-z0-9+.-]+$/;
const PACKAGE_VERSION = /^[A-Za-z0-9.+~:-]+$/;
const SUITE = /^[a-z][a-z0-9-]*$/;
const BUSYBOX_PACKAGE = "busybox-static";

export function debianArch(): string {
  switch (process.arch) {
    case "x64":
      return "amd64";
    case "arm64":
      return "arm64";
    default:
      throw new ForkdError("unavailable", `image builds are not supported on ${process.arch} hosts`);
  }
}

export async function hostDistro(osReleaseFile = "/etc/os-release"): Promise<HostDistro> {
  let text: string;
  try {
    text = await fs.readFile(osReleaseFile, "utf8");
  } catch {
    throw new ForkdError("unavailable", `cannot read ${osReleaseFile}: image builds need a Debian host`);
  }
  const codename = /^VERSION_CODENAME=["']?([^"'\n]*)["']?$/m.exec(text)?.[1];
  if (!codename || !SUITE.test(codename)) {
    throw new ForkdError(
      "unavailable",
      `${osReleaseFile} has no usable VERSION_CODENAME: image builds need a Debian host with a release codename`,
    );
  }
  return { suite: codename, arch: debianArch() };
}

/** The fields of `apt-cache show --no-all-versions` stanzas, one record per package. */
function parseStanzas(text: string): Map<string, Record<string, string>> {
  const out = new Map<string, Record<string, string>>();
  for (const stanza of text.split(/\n\s*\n/)) {
    const fields: Record<string, string> = {};
    let last: string | undefined;
    for (const line of stanza.split("\n")) {
      if (/^\s/.test(line) && last) {
        fields[last] += `\n${line.trim()}`;
        continue;
      }
      const m = /^([A-Za-z0-9-]+):\s?(.*)$/.exec(line);
      if (m) {
        last = m[1]!;
        fields[last] = m[2]!;
      }
    }
    if (fields.Package && !out.has(fields.Package)) out.set(fields.Package, fields);
  }
  return out;
}

async function candidates(
  packages: string[],
  signal?: AbortSignal,
): Promise<Map<string, Record<string, string>>> {
  let text: string;
  try {
    text = await runText("apt-cache", ["show", "--no-all-versions", ...packages], { signal });
  } catch (err) {
    if (err instanceof ForkdError && err.code === "internal") {
      throw new ForkdError(
        "unavailable",
        `apt has no installable candidate for ${packages.join(", ")} (check the host's apt sources and run apt-get update): ${err.message}`,
        { cause: err },
      );
    }
    throw err;
  }
  return parseStanzas(text);
}

function versionOf(stanzas: Map<string, Record<string, string>>, pkg: string): string {
  const version = stanzas.get(pkg)?.Version;
  if (!version || !PACKAGE_VERSION.test(version)) {
    throw new ForkdError("unavailable", `apt-cache reported no usable version for ${pkg}`);
  }
  return version;
}

/** Asks apt which kernel and busybox a build would use right now. */
export async function resolveBootPackagesUncached(arch: string, signal?: AbortSignal): Promise<BootPackages> {
  const meta = `linux-image-${arch}`;
  const first = await candidates([meta, BUSYBOX_PACKAGE], signal);
  const depends = first.get(meta)?.Depends ?? "";
  const kernelPackage = depends
    .split(",")
    .map((dep) => dep.split("|")[0]!.trim().split(/\s/)[0]!)
    .find((name) => name.startsWith("linux-image-") && PACKAGE_NAME.test(name));
  if (!kernelPackage) {
    throw new ForkdError(
      "unavailable",
      `cannot find the kernel package ${meta} depends on (Depends: "${depends}")`,
    );
  }
  const busyboxVersion = versionOf(first, BUSYBOX_PACKAGE);
  const second = await candidates([kernelPackage], signal);
  return { kernelPackage, kernelVersion: versionOf(second, kernelPackage), busyboxVersion };
}

/**
 * Files whose change can change what apt resolves. Their mtimes key the resolution cache, so a build after
 * `apt-get update` or a sources edit asks apt again, and every other build skips the ~1 s apt-cache calls.
 */
const APT_STATE_PATHS = [
  "/var/lib/apt/lists",
  "/etc/apt/sources.list",
  "/etc/apt/sources.list.d",
  "/etc/apt/preferences",
  "/etc/apt/preferences.d",
];

async function aptStateKey(arch: string): Promise<string> {
  const parts: string[] = [arch, process.env.APT_CONFIG ?? ""];
  for (const p of APT_STATE_PATHS) {
    try {
      const st = await fs.stat(p);
      parts.push(`${p}:${st.mtimeMs}:${st.size}`);
    } catch {
      parts.push(`${p}:-`);
    }
  }
  return parts.join("|");
}

interface ResolutionCache {
  key: string;
  packages: BootPackages;
}

function isBootPackages(v: unknown): v is BootPackages {
  const p = v as BootPackages;
  return (
    typeof p === "object" &&
    p !== null &&
    typeof p.kernelPackage === "string" &&
    PACKAGE_NAME.test(p.kernelPackage) &&
    typeof p.kernelVersion === "string" &&
    PACKAGE_VERSION.test(p.kernelVersion) &&
    typeof p.busyboxVersion === "string" &&
    PACKAGE_VERSION.test(p.busyboxVersion)
  );
}

/** `resolveBootPackagesUncached`, remembered in `cacheDir` until the host's apt state changes. */
export async function resolveBootPackages(
  cacheDir: string,
  arch: string,
  signal?: AbortSignal,
): Promise<BootPackages> {
  const file = path.join(cacheDir, ".apt-resolution.json");
  const key = await aptStateKey(arch);
  try {
    const cached = JSON.parse(await fs.readFile(file, "utf8")) as ResolutionCache;
    if (cached.key === key && isBootPackages(cached.packages)) return cached.packages;
  } catch {
    // no cache yet, or unreadable: ask apt
  }
  const packages = await resolveBootPackagesUncached(arch, signal);
  await fs.mkdir(cacheDir, { recursive: true });
  const tmp = `${file}.${process.pid}.${Date.now()}.tmp`;
  await fs.writeFile(tmp, JSON.stringify({ key, packages } satisfies ResolutionCache));
  await fs.rename(tmp, file);
  return packages;
}

/** Downloads exact package versions into `dir` with the host's apt; returns the .deb path per package. */
export async function downloadPackages(
  specs: { name: string; version: string }[],
  dir: string,
  signal?: AbortSignal,
): Promise<Map<string, string>> {
  await run("apt-get", ["download", "-q", ...specs.map((s) => `${s.name}=${s.version}`)], {
    cwd: dir,
    signal,
    stdout: "ignore",
  });
  const files = await fs.readdir(dir);
  const out = new Map<string, string>();
  for (const spec of specs) {
    const deb = files.find((f) => f.startsWith(`${spec.name}_`) && f.endsWith(".deb"));
    if (!deb) throw new ForkdError("internal", `apt-get download did not produce a .deb for ${spec.name}`);
    out.set(spec.name, path.join(dir, deb));
  }
  return out;
}

/**
 * Names of `packages` the host's apt knows nothing about (neither a real nor a virtual package). Checked
 * before a build so a typo fails in a second instead of after mmdebstrap installed the base system.
 */
export async function unknownPackages(packages: string[], signal?: AbortSignal): Promise<string[]> {
  if (packages.length === 0) return [];
  const text = await runText("apt-cache", ["policy", ...packages], { signal });
  const known = new Set<string>();
  for (const m of text.matchAll(/^(\S+):$/gm)) known.add(m[1]!.replace(/:[a-z0-9]+$/, ""));
  return packages.filter((p) => !known.has(p));
}
