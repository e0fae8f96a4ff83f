/**
 * envd's keepalives: a streaming call whose client sent `Keepalive-Ping-Interval: <seconds>` gets a keepalive
 * message whenever that long passed without one, so proxies and the client's idle timers see traffic while a
 * process or watch is quiet.
 */
export const KEEPALIVE_HEADER = "keepalive-ping-interval";

/** The interval a request asked for, in ms (1 s .. 1 h), or null for none. */
export function keepaliveIntervalMs(headers: Headers): number | null {
  const value = headers.get(KEEPALIVE_HEADER);
  if (value === null || !/^\d{1,5}$/.test(value)) return null;
  const seconds = Number(value);
  return seconds >= 1 && seconds <= 3600 ? seconds * 1000 : null;
}

export const KEEPALIVE = Symbol("keepalive");

/**
 * The items of `source`, with KEEPALIVE in between whenever `intervalMs` passed without an item. The pending
 * read is kept across keepalives, so no item is lost or read twice; ending early returns the source iterator.
 */
export async function* withKeepalives<T>(
  source: AsyncIterable<T>,
  intervalMs: number | null,
): AsyncGenerator<T | typeof KEEPALIVE> {
  const iterator = source[Symbol.asyncIterator]();
  let pending: Promise<IteratorResult<T>> | undefined;
  try {
    for (;;) {
      pending ??= iterator.next();
      let timer: NodeJS.Timeout | undefined;
      const tick =
        intervalMs === null
          ? null
          : new Promise<typeof KEEPALIVE>((resolve) => {
              timer = setTimeout(() => resolve(KEEPALIVE), intervalMs);
            });
      const next = await (tick === null ? pending : Promise.race([pending, tick]));
      clearTimeout(timer);
      if (next === KEEPALIVE) {
        yield KEEPALIVE;
        continue;
      }
      pending = undefined;
      if (next.done) return;
      yield next.value;
    }
  } finally {
    pending?.catch(() => {});
    await iterator.return?.();
  }
}
