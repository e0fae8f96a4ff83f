/**
 * One lock per key (a sandbox id): the operations that change what a sandbox is (pause, resume, kill, BRANCH)
 * run one after another, in the order they were asked for, while calls into a running guest do not wait.
 */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<void>>();

  /** Runs `work` once every earlier holder of `key` is done; its result or error is passed through. */
  async run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    let release: () => void = () => {};
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    const tail = previous.then(() => mine);
    this.tails.set(key, tail);
    await previous;
    try {
      return await work();
    } finally {
      release();
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }

  /** Whether anyone holds or waits for `key`. */
  busy(key: string): boolean {
    return this.tails.has(key);
  }
}
