/**
 * A deadline as an AbortSignal that reliably fires. Why not `AbortSignal.any([AbortSignal.timeout(ms), parent])`
 * (src/common/deadline.ts): on Node 20 the composite holds its timeout source weakly, and once that source is
 * garbage-collected the composite never aborts, even with listeners attached (reproduced on 20.20 with
 * --expose-gc; a KVM probe waited 15 minutes instead of 8 seconds). Here a timer owns the controller.
 */

export interface TimeoutSignal {
  signal: AbortSignal;
  /** Stops the timer and detaches from the parent; call when the guarded operation is over. */
  dispose(): void;
}

/** Aborts after `ms` with a TimeoutError DOMException (what `abortError` maps to `timeout`), or with the parent. */
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
