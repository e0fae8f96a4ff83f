/**
 * The benchmarks' knobs: BENCH_* environment variables (bench/README.md lists them). A number that is set but
 * not one ends the run with its name instead of measuring with NaN.
 */

/** `name`'s value as a number, or `fallback` when it is unset or empty. */
export function envNumber(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value)) throw new Error(`${name}=${JSON.stringify(raw)} is not a number`);
  return value;
}

/** `name`'s value as a number, or undefined when it is unset or empty (the callee's default then applies). */
export function envOptionalNumber(name: string): number | undefined {
  const raw = process.env[name];
  return raw === undefined || raw.trim() === "" ? undefined : envNumber(name, 0);
}
