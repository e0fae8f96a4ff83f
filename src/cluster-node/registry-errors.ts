/**
 * A registry that cannot be reached is an outage, not a bad request: a pull or push that failed because the
 * registry did not answer (refused, unreachable, timed out, 5xx) is answered 503 naming the registry, so callers
 * (the gateway, the controller) tell it from a snapshot that is wrong, and retry elsewhere or later.
 */
import { errorMessage, ForkdError } from "../common/errors.js";

const OUTAGE =
  /connection refused|no route to host|network is unreachable|i\/o timeout|timeout awaiting|tls handshake timeout|context deadline exceeded|connection reset|unexpected EOF|\b50[234]\b|service unavailable|bad gateway|dial tcp|server misbehaving|no such host/i;

/** The registry host[:port] of a reference. */
export function registryHost(reference: string): string {
  const first = reference.split("/")[0] ?? reference;
  return first.includes(".") || first.includes(":") || first === "localhost" ? first : "docker.io";
}

export function registryFailure(reference: string, err: unknown): unknown {
  if (err instanceof ForkdError && err.code !== "internal" && err.code !== "unprocessable") {
    if (err.code !== "unavailable" && err.code !== "timeout") return err;
  }
  const message = errorMessage(err);
  if (!OUTAGE.test(message)) return err;
  return new ForkdError(
    "unavailable",
    `the registry ${registryHost(reference)} is unavailable (${oneLine(message)}); work on this node's own snapshots goes on`,
    { cause: err, detail: { registry: registryHost(reference) } },
  );
}

function oneLine(text: string): string {
  const line =
    text
      .split("\n")
      .map((l) => l.trim())
      .filter(Boolean)
      .slice(-1)[0] ?? text;
  return line.length > 300 ? `${line.slice(0, 300)}...` : line;
}
