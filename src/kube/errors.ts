/** Failed Kubernetes API calls, as forkd's components handle them. */
import { ApiException } from "@kubernetes/client-node";

/** The HTTP status of a failed client call (ApiException's code), or undefined for a network failure. */
export function kubeStatusOf(err: unknown): number | undefined {
  if (err instanceof ApiException) return err.code;
  const code = (err as { code?: unknown; statusCode?: unknown })?.statusCode;
  return typeof code === "number" ? code : undefined;
}

export const isNotFound = (err: unknown) => kubeStatusOf(err) === 404;
export const isConflict = (err: unknown) => kubeStatusOf(err) === 409;

/** One line saying what failed: the API server's message when it sent one (a Status body), else the error's. */
export function describeKubeError(what: string, err: unknown): string {
  if (err instanceof ApiException) {
    const body = err.body as unknown;
    let message: string | undefined;
    if (typeof body === "string") {
      try {
        message = (JSON.parse(body) as { message?: string }).message;
      } catch {
        message = body.slice(0, 300);
      }
    } else if (body && typeof body === "object") {
      message = (body as { message?: string }).message;
    }
    return `${what}: HTTP ${err.code}${message ? `: ${message}` : ""}`;
  }
  return `${what}: ${err instanceof Error ? err.message : String(err)}`;
}
