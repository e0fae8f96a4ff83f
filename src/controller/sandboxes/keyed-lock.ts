/**
 * One lock per key (a sandbox id): the operations that change what a sandbox is (pause, resume, kill, BRANCH)
 * run one after another, in the order they were asked for, while calls into a running guest do not wait.
 */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<void>>();

  /** Runs `work` once every earlier holder of `key` is done; its result or error is passed through. */
  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    return this.runHolding(key, async () => ({ result: await work() }));
  }

  /**
   * Like run, but `work` may hand back `hold`: the caller gets `result` at once, and the lock stays held until
   * `hold` settles, so the next holder starts only after it (a paused VM's stop, which the pause's caller need
   * not wait for but a resume of that sandbox must).
   */
  async runHolding<T>(key: string, work: () => Promise<{ result: T; hold?: Promise<unknown> }>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    let release: () => void = () => {};
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    const tail = previous.then(() => mine);
    this.tails.set(key, tail);
    await previous;
    let hold: Promise<unknown> | undefined;
    try {
      const done = await work();
      hold = done.hold;
      return done.result;
    } finally {
      const free = () => {
        release();
        if (this.tails.get(key) === tail) this.tails.delete(key);
      };
      if (hold) hold.then(free, free);
      else free();
    }
  }

  /** Whether anyone holds or waits for `key`. */
  busy(key: string): boolean {
    return this.tails.has(key);
  }
}
