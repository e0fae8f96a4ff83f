/**
 * Images made in the tests, offline, with the same tools forkd uses: a busybox image (static busybox from the
 * host's busybox-static, no libc, no Python) made from a directory with umoci and saved as an OCI layout, an
 * OCI archive or a Docker archive with skopeo; and hand-written layouts whose one layer is a tar written
 * header by header (node-tar's Header), for the hostile cases no honest tool produces.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { Header } from "tar";

const execFileAsync = promisify(execFile);

export const BUSYBOX = "/bin/busybox";
const APPLETS = [
  "sh",
  "ls",
  "cat",
  "echo",
  "env",
  "pwd",
  "id",
  "wget",
  "httpd",
  "nc",
  "sleep",
  "touch",
  "mkdir",
  "grep",
  "ps",
  "test",
  "true",
  "false",
  "ip",
  // A filesystem-only pause runs `sync` in the guest.
  "sync",
];

/**
 * A busybox image in the OCI layout `<dir>/layout` (tag "latest"): /bin/busybox and its applets, /etc/passwd
 * with root and `app` (uid 4242), PATH=/bin and GREETING=hello in its config, working directory /.
 */
export async function makeBusyboxLayout(dir: string): Promise<string> {
  const layout = path.join(dir, "layout");
  const bundle = path.join(dir, "bundle");
  await execFileAsync("umoci", ["init", "--layout", layout]);
  await execFileAsync("umoci", ["new", "--image", `${layout}:latest`]);
  await execFileAsync("umoci", ["unpack", "--image", `${layout}:latest`, bundle]);
  const root = path.join(bundle, "rootfs");
  await fs.mkdir(path.join(root, "bin"), { recursive: true });
  await fs.mkdir(path.join(root, "etc"), { recursive: true });
  await fs.mkdir(path.join(root, "home", "app"), { recursive: true });
  await fs.chown(path.join(root, "home", "app"), 4242, 4242);
  await fs.copyFile(BUSYBOX, path.join(root, "bin", "busybox"));
  await fs.chmod(path.join(root, "bin", "busybox"), 0o755);
  for (const applet of APPLETS) await fs.symlink("busybox", path.join(root, "bin", applet));
  await fs.writeFile(
    path.join(root, "etc", "passwd"),
    "root:x:0:0:root:/root:/bin/sh\napp:x:4242:4242:app:/home/app:/bin/sh\n",
  );
  await fs.writeFile(path.join(root, "etc", "group"), "root:x:0:\napp:x:4242:\n");
  await execFileAsync("umoci", ["repack", "--image", `${layout}:latest`, bundle]);
  await execFileAsync("umoci", [
    "config",
    "--image",
    `${layout}:latest`,
    "--config.env",
    "PATH=/bin",
    "--config.env",
    "GREETING=hello",
    "--config.cmd",
    "/bin/sh",
  ]);
  await fs.rm(bundle, { recursive: true, force: true });
  return layout;
}

export async function saveArchive(
  layout: string,
  kind: "oci-archive" | "docker-archive",
  file: string,
): Promise<void> {
  const dest =
    kind === "oci-archive" ? `oci-archive:${file}:latest` : `docker-archive:${file}:busybox:latest`;
  await execFileAsync("skopeo", ["copy", "--quiet", `oci:${layout}:latest`, dest]);
}

export interface RawEntry {
  path: string;
  type: "File" | "Directory" | "SymbolicLink" | "Link" | "CharacterDevice" | "BlockDevice";
  linkpath?: string;
  body?: string;
  mode?: number;
  devmaj?: number;
  devmin?: number;
}

/** A tar archive written entry by entry, exactly as given (no normalization of paths). */
export function rawTar(entries: RawEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? "");
    const header = new Header({
      path: e.path,
      type: e.type,
      linkpath: e.linkpath,
      mode: e.mode ?? (e.type === "Directory" ? 0o755 : 0o644),
      size: e.type === "File" ? body.length : 0,
      uid: 0,
      gid: 0,
      mtime: new Date(0),
      devmaj: e.devmaj ?? 0,
      devmin: e.devmin ?? 0,
    });
    const block = Buffer.alloc(512);
    header.encode(block, 0);
    blocks.push(block);
    if (e.type === "File" && body.length > 0) {
      const padded = Buffer.alloc(Math.ceil(body.length / 512) * 512);
      body.copy(padded);
      blocks.push(padded);
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

async function putBlob(layout: string, data: Buffer): Promise<{ digest: string; size: number }> {
  const hex = createHash("sha256").update(data).digest("hex");
  await fs.writeFile(path.join(layout, "blobs", "sha256", hex), data);
  return { digest: `sha256:${hex}`, size: data.length };
}

/** An OCI layout at `layout` (tag "latest") whose layers are `layers` (uncompressed tars), lowest first. */
export async function makeRawLayout(layout: string, layers: Buffer[]): Promise<string> {
  await fs.mkdir(path.join(layout, "blobs", "sha256"), { recursive: true });
  await fs.writeFile(path.join(layout, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}');
  const layerDescriptors = [];
  const diffIds = [];
  for (const layer of layers) {
    const blob = await putBlob(layout, layer);
    layerDescriptors.push({ mediaType: "application/vnd.oci.image.layer.v1.tar", ...blob });
    diffIds.push(blob.digest);
  }
  const config = await putBlob(
    layout,
    Buffer.from(
      JSON.stringify({
        architecture: "amd64",
        os: "linux",
        config: { Env: ["PATH=/bin"] },
        rootfs: { type: "layers", diff_ids: diffIds },
      }),
    ),
  );
  const manifest = await putBlob(
    layout,
    Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        config: { mediaType: "application/vnd.oci.image.config.v1+json", ...config },
        layers: layerDescriptors,
      }),
    ),
  );
  await fs.writeFile(
    path.join(layout, "index.json"),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          ...manifest,
          annotations: { "org.opencontainers.image.ref.name": "latest" },
        },
      ],
    }),
  );
  return layout;
}

/** The directories and busybox a hostile layer needs around it to be a plausible image. */
export function plausibleBase(): Buffer {
  return rawTar([
    { path: "bin/", type: "Directory" },
    { path: "etc/", type: "Directory" },
    { path: "etc/passwd", type: "File", body: "root:x:0:0:root:/root:/bin/sh\n" },
    { path: "dev/", type: "Directory" },
  ]);
}
