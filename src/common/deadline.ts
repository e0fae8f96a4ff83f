/** Deadlines as AbortSignals, so every long operation can be cancelled by a timeout or by the caller alike. */
import { ForkdError } from "./errors.js";

/** A signal that aborts when `ms` elapse or when any of `parents` aborts. */
export function deadlineSignal(ms: number, ...parents: (AbortSignal | undefined)[]): AbortSignal {
  const signals = [AbortSignal.timeout(ms), ...parents.filter((s): s is AbortSignal => s !== undefined)];
  return AbortSignal.any(signals);
}

/** Throws a `timeout` ForkdError (or the caller's abort reason) if `signal` is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined, what: string): void {
  if (!signal?.aborted) return;
  throw abortError(signal, what);
}

export function abortError(signal: AbortSignal, what: string): Error {
  const reason: unknown = signal.reason;
  if (reason instanceof DOMException && reason.name === "TimeoutError") {
    return new ForkdError("timeout", `${what}: deadline exceeded`);
  }
  if (reason instanceof Error) return reason;
  return new ForkdError("unavailable", `${what}: cancelled`);
}

/** Resolves after `ms`, or rejects as soon as `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal, "sleep"));
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal as AbortSignal, "sleep"));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
