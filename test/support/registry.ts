/**
 * A real OCI registry for tests: Debian's docker-registry on a loopback port of its own (plain HTTP, which skopeo
 * and forkd allow on loopback only), its own storage, deletes enabled (as forkd's durable pauses need), every
 * request logged as JSON.
 */
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { entries, waitFor } from "./host.js";

export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A docker-registry on 127.0.0.1 with its own storage, logging every request as JSON. */
export class Registry {
  process: ChildProcess | undefined;
  constructor(
    readonly dir: string,
    readonly port: number,
  ) {}

  get log(): string {
    return path.join(this.dir, "registry.log");
  }

  async start(): Promise<void> {
    const config = `version: 0.1
log:
  level: info
  formatter: json
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: ${path.join(this.dir, "data")}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:${this.port}
`;
    await fs.writeFile(path.join(this.dir, "config.yml"), config);
    const out = await fs.open(this.log, "w");
    this.process = spawn("docker-registry", ["serve", path.join(this.dir, "config.yml")], {
      stdio: ["ignore", out.fd, out.fd],
    });
    await out.close();
    await waitFor("the registry to answer", 30_000, async () => {
      const res = await fetch(`http://127.0.0.1:${this.port}/v2/`).catch(() => undefined);
      return res?.ok ? true : undefined;
    });
  }

  async stop(): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    await exited;
  }

  /** [method, path] of every request the registry has answered, in order. */
  async requests(): Promise<[string, string][]> {
    const out: [string, string][] = [];
    for (const line of (await fs.readFile(this.log, "utf8")).split("\n")) {
      if (!line.startsWith("{")) continue;
      const entry = JSON.parse(line) as Record<string, string>;
      if (entry.msg === "response completed" && entry["http.request.method"]) {
        out.push([entry["http.request.method"], (entry["http.request.uri"] ?? "").split("?")[0] as string]);
      }
    }
    return out;
  }

  /** The HTTP status of a manifest by tag or digest (200 there, 404 gone), asked with the distribution API. */
  async manifestStatus(repository: string, reference: string): Promise<number> {
    const answer = await fetch(`http://127.0.0.1:${this.port}/v2/${repository}/manifests/${reference}`, {
      method: "HEAD",
      headers: {
        accept:
          "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
      },
    });
    return answer.status;
  }

  /** Blobs the registry stores (its filesystem driver keeps one data file per blob). */
  async blobs(): Promise<Set<string>> {
    const root = path.join(this.dir, "data", "docker", "registry", "v2", "blobs", "sha256");
    const found = new Set<string>();
    for (const prefix of await entries(root)) {
      for (const hex of await entries(path.join(root, prefix))) found.add(`sha256:${hex}`);
    }
    return found;
  }
}
