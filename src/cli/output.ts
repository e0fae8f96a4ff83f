/** Terminal output helpers: JSON for scripts, aligned tables for people, progress on stderr. */
import ora, { type Ora } from "ora";

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** Aligned columns; `rows` are already strings. */
export function printTable(headers: string[], rows: string[][]): void {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  process.stdout.write(`${line(headers)}\n`);
  for (const row of rows) process.stdout.write(`${line(row)}\n`);
}

/** One line, control characters escaped: guest output is untrusted and must not drive the terminal. */
export function oneLine(text: string, max = 60): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: stripping control characters is the point
  const flat = text.replace(/\r?\n/g, "\\n").replace(/[\u0000-\u001f\u007f]/g, "?");
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

export interface Progress {
  update(text: string): void;
  succeed(text: string): void;
  fail(text: string): void;
  stop(): void;
}

/** A spinner on an interactive stderr; plain timestamped lines otherwise (CI logs, pipes). */
export function startProgress(text: string): Progress {
  if (process.stderr.isTTY) {
    const spinner: Ora = ora({ text, stream: process.stderr }).start();
    return {
      update: (t) => {
        spinner.text = t;
      },
      succeed: (t) => spinner.succeed(t),
      fail: (t) => spinner.fail(t),
      stop: () => spinner.stop(),
    };
  }
  const started = performance.now();
  const log = (mark: string, t: string) =>
    process.stderr.write(
      `[${((performance.now() - started) / 1000).toFixed(1).padStart(6)}s] ${mark} ${t}\n`,
    );
  log("…", text);
  return {
    update: (t) => log("…", t),
    succeed: (t) => log("✔", t),
    fail: (t) => log("✖", t),
    stop: () => {},
  };
}
