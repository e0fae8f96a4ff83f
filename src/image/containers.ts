/**
 * The container tools the format-2 builder is made of, each called with argv arrays (never a shell):
 *
 *   skopeo   copies images between transports (OCI layout, OCI/Docker archive, registry) and reads registry
 *            manifests; registry credentials come from its usual auth files (REGISTRY_AUTH_FILE,
 *            $XDG_RUNTIME_DIR/containers/auth.json, ~/.docker/config.json)
 *   umoci    unpacks an OCI image into a directory tree and repacks a changed tree as a new layer
 *   buildah  builds Dockerfiles without a daemon (rootful, vfs storage driver, chroot isolation)
 *
 * skopeo's transport syntax uses ':' as a separator, so every path handed to it must be free of ':'.
 */
import { ForkdError } from "../common/errors.js";
import { type RunOptions, run, runText } from "./run.js";

/** What skopeo, umoci and buildah are given for the platform: guests are linux on the host's architecture. */
export const GUEST_PLATFORM = { os: "linux", arch: process.arch === "arm64" ? "arm64" : "amd64" };

function assertTransportPath(p: string): string {
  if (p.includes(":")) {
    throw new ForkdError(
      "invalid_argument",
      `${p}: image paths may not contain ':' (skopeo reads it as a separator); move or link the file`,
    );
  }
  return p;
}

/** A skopeo image name for a local OCI layout, optionally naming one image in it. */
export function ociLayoutName(dir: string, ref?: string): string {
  return `oci:${assertTransportPath(dir)}${ref === undefined ? "" : `:${ref}`}`;
}

export type ArchiveKind = "oci-archive" | "docker-archive";

export function archiveName(kind: ArchiveKind, file: string, ref?: string): string {
  return `${kind}:${assertTransportPath(file)}${ref === undefined ? "" : `:${ref}`}`;
}

/** Hosts a registry may be reached on without TLS (as Docker treats localhost). */
export function isLoopbackRegistry(reference: string): boolean {
  const host = registryHost(reference);
  if (host === undefined) return false;
  const name = host.replace(/:[0-9]+$/, "");
  return name === "localhost" || /^127(?:\.[0-9]{1,3}){3}$/.test(name) || name === "[::1]";
}

/** The registry host[:port] of a reference, or undefined for a short name (Docker Hub). */
export function registryHost(reference: string): string | undefined {
  const slash = reference.indexOf("/");
  if (slash < 0) return undefined;
  const first = reference.slice(0, slash);
  return first.includes(".") || first.includes(":") || first === "localhost" || first.startsWith("[")
    ? first
    : undefined;
}

/**
 * Whether skopeo must verify TLS for `reference`: always, except on a loopback registry (plain HTTP allowed)
 * or when the caller said `insecure`.
 */
export function registryTlsVerify(reference: string, insecure: boolean): boolean {
  return !(insecure || isLoopbackRegistry(reference));
}

export interface SkopeoOptions extends Pick<RunOptions, "signal"> {
  srcTlsVerify?: boolean;
  destTlsVerify?: boolean;
  label?: string;
  /** Called with each blob skopeo did not send because the destination already has it. */
  onBlobSkipped?: (digest: string) => void;
  /** Called with skopeo's progress lines ("Copying blob ..."). */
  onLine?: (line: string) => void;
}

const SKIPPED_BLOB = /Skipping blob (sha256:[0-9a-f]{64}) \(already present\)/;

/**
 * `skopeo copy src dest` for this host's platform. With `onBlobSkipped`, skopeo runs with --debug (the only way
 * it says which blobs it skipped); its debug lines are matched, never shown or kept in an error message.
 */
export async function skopeoCopy(src: string, dest: string, options: SkopeoOptions = {}): Promise<void> {
  const debug = options.onBlobSkipped !== undefined;
  const args = [
    ...(debug ? ["--debug"] : []),
    "--override-os",
    GUEST_PLATFORM.os,
    "--override-arch",
    GUEST_PLATFORM.arch,
    "copy",
  ];
  if (!debug && !options.onLine) args.push("--quiet");
  if (options.srcTlsVerify !== undefined) args.push(`--src-tls-verify=${options.srcTlsVerify}`);
  if (options.destTlsVerify !== undefined) args.push(`--dest-tls-verify=${options.destTlsVerify}`);
  args.push("--", src, dest);
  const label = options.label ?? `skopeo copy ${src} ${dest}`;
  let plain = "";
  const onLine = (line: string) => {
    const skipped = SKIPPED_BLOB.exec(line);
    if (skipped) options.onBlobSkipped?.(skipped[1] as string);
    // --debug lines are left out of the failure's message, except the error that ended the copy.
    if (line.startsWith("time=") && !/ level=(fatal|error) /.test(line)) return;
    plain = `${plain}${line}\n`.slice(-4096);
    options.onLine?.(line);
  };
  try {
    await run("skopeo", args, {
      signal: options.signal,
      stdout: debug || options.onLine ? "lines" : "ignore",
      onStderrLine: debug || options.onLine ? onLine : undefined,
      label,
      tailBytes: debug ? 0 : undefined,
    });
  } catch (err) {
    if (!debug || !(err instanceof ForkdError) || options.signal?.aborted) throw err;
    const status = /\((exit status \d+|killed by \w+)\)/.exec(err.message)?.[1] ?? "failed";
    throw new ForkdError(err.code, `${label} failed (${status})${plain.trim() ? `:\n${plain.trim()}` : ""}`, {
      cause: err,
    });
  }
}

/**
 * Deletes a manifest from a registry (`docker://host/name@sha256:...`): the registry must allow deletes
 * (docker-registry: storage.delete.enabled); its blobs go only with the registry's own garbage collection.
 */
export async function skopeoDelete(
  image: string,
  options: { tlsVerify?: boolean; signal?: AbortSignal } = {},
): Promise<void> {
  const args = ["delete", "--retry-times", "2"];
  if (options.tlsVerify !== undefined) args.push(`--tls-verify=${options.tlsVerify}`);
  args.push("--", image);
  await run("skopeo", args, { signal: options.signal, stdout: "ignore", label: `skopeo delete ${image}` });
}

/** A registry's raw manifest (`what: "manifest"`) or the config blob it names (`"config"`). */
export async function skopeoInspectRaw(
  image: string,
  what: "manifest" | "config",
  options: { tlsVerify?: boolean; signal?: AbortSignal; maxBytes?: number } = {},
): Promise<string> {
  const args = ["inspect", "--raw", "--retry-times", "2"];
  if (what === "config") args.push("--config");
  if (options.tlsVerify !== undefined) args.push(`--tls-verify=${options.tlsVerify}`);
  args.push("--", image);
  return runText("skopeo", args, {
    signal: options.signal,
    maxStdoutBytes: options.maxBytes ?? 4 * 1024 * 1024,
    label: `skopeo inspect ${image}`,
  });
}

export async function umociInitLayout(dir: string, signal?: AbortSignal): Promise<void> {
  await run("umoci", ["init", "--layout", dir], { signal, stdout: "ignore" });
  await run("umoci", ["new", "--image", `${dir}:image`], { signal, stdout: "ignore" });
}

/**
 * Unpacks `<layout>:image` into the runtime bundle `bundle` (its tree is `bundle/rootfs`). With `idMap`
 * (umoci's container:host:size) every owner is shifted by it on disk, as build steps need their trees
 * (step-sandbox/identity.ts); umoci records the mapping in the bundle and `umociRepack` shifts back.
 */
export async function umociUnpack(
  layout: string,
  bundle: string,
  signal?: AbortSignal,
  idMap?: string,
): Promise<void> {
  const mapping = idMap === undefined ? [] : ["--uid-map", idMap, "--gid-map", idMap];
  await run("umoci", ["unpack", ...mapping, "--image", `${layout}:image`, bundle], {
    signal,
    stdout: "ignore",
    label: "umoci unpack",
  });
}

/**
 * Adds what changed in `bundle/rootfs` since it was unpacked (or last repacked) as a new layer of
 * `<layout>:image`, and records the tree as the bundle's new starting point. Volumes are not masked: the
 * guest has no volumes, every path belongs to the image.
 */
export async function umociRepack(
  layout: string,
  bundle: string,
  createdBy: string,
  signal?: AbortSignal,
): Promise<void> {
  await run(
    "umoci",
    [
      "repack",
      "--refresh-bundle",
      "--no-mask-volumes",
      "--history.created_by",
      createdBy.slice(0, 1000),
      "--image",
      `${layout}:image`,
      bundle,
    ],
    { signal, stdout: "ignore", label: "umoci repack" },
  );
}
