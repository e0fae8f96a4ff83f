/** Deadlines as AbortSignals, so every long operation can be cancelled by a timeout or by the caller alike. */
import { ForkdError } from "./errors.js";

export interface TimeoutSignal {
  signal: AbortSignal;
  /** Stops the timer and detaches from the parent; call when the guarded operation is over. */
  dispose(): void;
}

/**
 * Aborts after `ms` with a TimeoutError DOMException (which `abortError` maps to `timeout`), or with the parent.
 * Why not `AbortSignal.any([AbortSignal.timeout(ms), parent])`: on Node 20 the composite holds its timeout source
 * weakly, and once that source is garbage-collected the composite never aborts (reproduced on 20.20 with
 * --expose-gc: a probe with an 8 s deadline waited 15 minutes). Here a timer owns the controller.
 */
export function timeoutSignal(ms: number, parent?: AbortSignal): TimeoutSignal {
  const controller = new AbortController();
  const onParentAbort = () => {
    clearTimeout(timer);
    controller.abort(parent?.reason);
  };
  const timer = setTimeout(() => {
    parent?.removeEventListener("abort", onParentAbort);
    controller.abort(new DOMException(`deadline of ${ms} ms exceeded`, "TimeoutError"));
  }, ms);
  // The timer keeps the controller alive; it must not keep the program alive by itself.
  timer.unref();
  if (parent?.aborted) onParentAbort();
  else parent?.addEventListener("abort", onParentAbort, { once: true });
  return {
    signal: controller.signal,
    dispose: () => {
      clearTimeout(timer);
      parent?.removeEventListener("abort", onParentAbort);
    },
  };
}

/**
 * A signal that aborts when `ms` elapse or when any of `parents` aborts (see `timeoutSignal`). Dispose it when
 * the guarded work is over: until then it listens on its parents, and a long-lived parent (a fork of 100
 * children, the daemon's shutdown signal) would collect one listener per operation.
 */
export function deadlineSignal(ms: number, ...parents: (AbortSignal | undefined)[]): TimeoutSignal {
  const present = parents.filter((s): s is AbortSignal => s !== undefined);
  // The callers hold their parent signals, so combining only those with AbortSignal.any is safe.
  const parent = present.length <= 1 ? present[0] : AbortSignal.any(present);
  return timeoutSignal(ms, parent);
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

/** Settles like `promise`, or rejects as soon as `signal` aborts without waiting for it. */
export function raceAbort<T>(promise: Promise<T>, signal: AbortSignal, what: string): Promise<T> {
  if (signal.aborted) return Promise.reject(abortError(signal, what));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortError(signal, what));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    );
  });
}
