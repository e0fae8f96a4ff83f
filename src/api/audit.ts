/**
 * The audit log: one JSON line per mutating request (who, what, the outcome and which sandboxes/snapshots it
 * touched), appended to a file the daemon never truncates. Rotation is external (logrotate renames the file, then
 * sends SIGHUP): `reopen()` starts a new file at the configured path.
 */
import { access, chmod, mkdir } from "node:fs/promises";
import path from "node:path";
import pino from "pino";
import { ForkdError } from "../common/errors.js";

export const DEFAULT_AUDIT_LOG = "/var/log/forkd/audit.log";

export interface AuditRecord {
  time: string;
  request_id: string;
  /** `uid:<n>` (Unix socket peer), `token:<8 hex>` (bearer token), or `tcp:<address>` (unauthenticated loopback). */
  caller: string;
  method: string;
  url: string;
  status: number;
  latency_ms: number;
  /** Sandbox ids and snapshot tags the request created, read or removed. */
  ids: string[];
  error?: string;
}

/**
 * Query parameters that are credentials: E2B's signed file URLs carry a signature that opens the sandbox's files
 * until it expires (and the envd token some clients put in the query). Their values never reach a log line.
 */
const CREDENTIAL_PARAMS = new Set(["signature", "access_token", "token"]);

/** `url` (a request target, path and query) with the values of credential parameters replaced by "redacted". */
export function redactUrl(url: string): string {
  const at = url.indexOf("?");
  if (at < 0) return url;
  const query = url
    .slice(at + 1)
    .split("&")
    .map((part) => {
      const eq = part.indexOf("=");
      const rawName = eq < 0 ? part : part.slice(0, eq);
      let name = rawName;
      try {
        name = decodeURIComponent(rawName.replace(/\+/g, " "));
      } catch {
        // an undecodable name is kept as it is (and is no credential parameter of ours)
      }
      return CREDENTIAL_PARAMS.has(name.toLowerCase()) && eq >= 0 ? `${rawName}=redacted` : part;
    })
    .join("&");
  return `${url.slice(0, at)}?${query}`;
}

type Destination = ReturnType<typeof pino.destination>;

export class AuditLog {
  private constructor(
    readonly file: string,
    private readonly destination: Destination,
    onError: (err: Error) => void,
  ) {
    destination.on("error", onError);
  }

  /** Opens (creating the directory 0750 and the file 0640) and waits until the file is really open. */
  static async open(file: string, onError: (err: Error) => void): Promise<AuditLog> {
    const absolute = path.resolve(file);
    await mkdir(path.dirname(absolute), { recursive: true, mode: 0o750 });
    const existed = await access(absolute).then(
      () => true,
      () => false,
    );
    const destination = pino.destination({ dest: absolute, append: true, sync: false, mode: 0o640 });
    await new Promise<void>((resolve, reject) => {
      destination.once("ready", () => resolve());
      destination.once("error", (err: Error) =>
        reject(new ForkdError("unavailable", `cannot open audit log ${absolute}: ${err.message}`)),
      );
    });
    // A new log is 0640 whatever the umask; an existing one keeps the mode its owner gave it.
    if (!existed) await chmod(absolute, 0o640);
    return new AuditLog(absolute, destination, onError);
  }

  write(record: AuditRecord): void {
    this.destination.write(`${JSON.stringify(record)}\n`);
  }

  /** After logrotate moved the file away: continue in a new file at the same path. */
  reopen(): void {
    this.destination.reopen();
  }

  /** Flushes what is buffered and closes the file. */
  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.destination.once("close", () => resolve());
      this.destination.once("error", () => resolve());
      this.destination.end();
    });
  }
}
