/**
 * A single-consumer queue exposed as an async iterable: the producer pushes items (with a callback run when
 * the consumer takes each, so the producer can account for what is still buffered), then ends or fails it.
 */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: { value: T; taken?: () => void }[] = [];
  private waiter: (() => void) | undefined;
  private finished = false;
  private error: Error | undefined;
  private iterators = 0;
  private returned = false;

  /** An iterator exists and has not been returned early. */
  get active(): boolean {
    return this.iterators > 0 && !this.returned;
  }

  /** The consumer stopped iterating early: nothing needs buffering any more. */
  get abandoned(): boolean {
    return this.returned;
  }

  push(value: T, taken?: () => void): void {
    if (this.finished || this.returned) return;
    this.items.push({ value, taken });
    this.wake();
  }

  end(): void {
    this.finished = true;
    this.wake();
  }

  /** Ends the queue with an error the consumer sees after the items already buffered. */
  fail(error: Error): void {
    if (this.finished) return;
    this.error = error;
    this.finished = true;
    this.wake();
  }

  /** Drops everything buffered and ends with `error` at once. */
  discard(error: Error): void {
    for (const item of this.items.splice(0)) item.taken?.();
    this.fail(error);
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    this.iterators++;
    return {
      next: async (): Promise<IteratorResult<T>> => {
        for (;;) {
          const item = this.items.shift();
          if (item !== undefined) {
            item.taken?.();
            return { value: item.value, done: false };
          }
          if (this.finished) {
            if (this.error !== undefined) {
              const error = this.error;
              this.error = undefined;
              throw error;
            }
            return { value: undefined, done: true };
          }
          await new Promise<void>((resolve) => {
            this.waiter = resolve;
          });
        }
      },
      return: async (): Promise<IteratorResult<T>> => {
        this.returned = true;
        for (const item of this.items.splice(0)) item.taken?.();
        return { value: undefined, done: true };
      },
    };
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }
}
