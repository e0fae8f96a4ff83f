/**
 * One call's cancellation: the caller's AbortSignal merged with the SDK's own timeouts. A timeout aborts with
 * a TimeoutError naming the setting that set it; the caller's abort keeps the caller's reason, like fetch.
 */
import { TimeoutError } from "./errors.js";

export class CallScope {
  private readonly controller = new AbortController();
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly onCallerAbort: () => void;

  constructor(private readonly callerSignal?: AbortSignal) {
    this.onCallerAbort = () => this.controller.abort(callerSignal?.reason);
    if (callerSignal?.aborted) this.onCallerAbort();
    else callerSignal?.addEventListener("abort", this.onCallerAbort, { once: true });
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** The reason to reject with once aborted: the caller's reason or the TimeoutError of the deadline that fired. */
  get reason(): unknown {
    return this.controller.signal.reason;
  }

  /**
   * Aborts the scope after `ms` (0 = never) with a TimeoutError naming `setting`. Returns a function that
   * cancels this deadline only (e.g. once the daemon accepted a streamed command).
   */
  deadline(ms: number, setting: string, what: string): () => void {
    if (ms === 0) return () => {};
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      this.controller.abort(
        new TimeoutError(
          `${what} did not finish within ${setting}=${ms} ms; pass a larger \`${setting}\` (0 disables it)`,
          { setting },
        ),
      );
    }, ms);
    this.timers.add(timer);
    return () => {
      clearTimeout(timer);
      this.timers.delete(timer);
    };
  }

  /** Aborts the scope now (e.g. a stream consumer stopped early); idempotent. */
  abort(reason?: unknown): void {
    this.controller.abort(reason);
  }

  /** Throws the abort reason if the scope was aborted. */
  throwIfAborted(): void {
    if (this.controller.signal.aborted) throw this.reason;
  }

  /** Clears timers and detaches from the caller's signal; call in `finally`. */
  dispose(): void {
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    this.callerSignal?.removeEventListener("abort", this.onCallerAbort);
  }
}
