/**
 * Paired statistics for a side-by-side bench: each round measures both paths back to back, so a round's
 * difference cancels what the round shares (host load, page cache, the guest's state), and the spread of the
 * differences, not of each path, bounds what the run can resolve.
 */

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

export function mean(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : values.reduce((a, b) => a + b, 0) / values.length;
}

/** Sample standard deviation (n - 1). */
export function stdev(values: readonly number[]): number {
  if (values.length < 2) return Number.NaN;
  const m = mean(values);
  return Math.sqrt(values.reduce((a, v) => a + (v - m) ** 2, 0) / (values.length - 1));
}

/** P(B <= k) for B ~ Binomial(n, 1/2). */
function binomialHalfCdf(n: number, k: number): number {
  let term = 0.5 ** n; // C(n, 0) / 2^n
  let sum = 0;
  for (let i = 0; i <= k; i++) {
    sum += term;
    term *= (n - i) / (i + 1);
  }
  return sum;
}

export interface MedianInterval {
  low: number;
  high: number;
  /** The interval's exact coverage (order statistics of n give only some levels), >= the one asked for. */
  coverage: number;
}

/**
 * The distribution-free (sign-test) interval for the median of `values`: [x_(k), x_(n+1-k)] with the largest k
 * whose coverage 1 - 2 P(B <= k-1), B ~ Bin(n, 1/2), is still at least `level`. It assumes only independent
 * rounds, not a normal spread; undefined when n is too small for that level (n < 6 at 95 %).
 */
export function medianInterval(values: readonly number[], level = 0.95): MedianInterval | undefined {
  const n = values.length;
  const s = [...values].sort((a, b) => a - b);
  let best: MedianInterval | undefined;
  for (let k = 1; k <= Math.floor(n / 2); k++) {
    const coverage = 1 - 2 * binomialHalfCdf(n, k - 1);
    if (coverage < level) break;
    best = { low: s[k - 1] as number, high: s[n - k] as number, coverage };
  }
  return best;
}

/** How many values are above zero, below it (ties left out): the sign test's counts. */
export function signs(values: readonly number[]): { above: number; below: number } {
  return { above: values.filter((v) => v > 0).length, below: values.filter((v) => v < 0).length };
}
