/**
 * `forkd token new`: a new API token for the daemon's token file, shaped like an E2B API key (`e2b_<hex>`) so
 * every E2B client accepts it as E2B_API_KEY. Printed on stdout, or appended to a token file (created private;
 * an existing one must already be private, as the daemon requires). The daemon reads the file at start.
 */
import { constants } from "node:fs";
import { type FileHandle, open, stat } from "node:fs/promises";
import type { Command } from "commander";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { isValidTenant, newApiKey } from "../../common/tokens.js";
import { runCommand } from "../run-command.js";

interface TokenNewOptions {
  tenant?: string;
  append?: string;
}

export function registerToken(program: Command): void {
  const token = program.command("token").description("API tokens for the daemon's --token-file");
  token
    .command("new")
    .description("print a new token (e2b_<40 hex>: an E2B API key every E2B SDK accepts)")
    .option("--tenant <name>", "the token belongs to this tenant (written as `<token> tenant=<name>`)")
    .option("--append <file>", "also append it to this token file (created with mode 0600)")
    .action((opts: TokenNewOptions) =>
      runCommand(async () => {
        if (opts.tenant !== undefined && !isValidTenant(opts.tenant)) {
          throw invalidArgument(
            `--tenant ${JSON.stringify(opts.tenant)}: lower-case letters, digits, '_', '-'`,
          );
        }
        const key = newApiKey();
        if (opts.append !== undefined) await appendLine(opts.append, tokenLine(key, opts.tenant));
        process.stdout.write(`${key}\n`);
        return undefined;
      }),
    );
}

function tokenLine(key: string, tenant: string | undefined): string {
  return tenant === undefined ? key : `${key} tenant=${tenant}`;
}

/** Appends one line; a file readable by others is refused (the daemon would refuse it too). */
async function appendLine(file: string, line: string): Promise<void> {
  const existing = await stat(file).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return undefined;
    throw err;
  });
  if (existing !== undefined && (!existing.isFile() || existing.mode & 0o077)) {
    throw new ForkdError(
      "invalid_argument",
      `${file} is not a private regular file (mode ${(existing.mode & 0o777).toString(8)}): chmod 600 it first`,
    );
  }
  const handle = await open(
    file,
    constants.O_RDWR | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW,
    0o600,
  );
  try {
    const size = (await handle.stat()).size;
    const separator = size > 0 && !(await endsWithNewline(handle, size)) ? "\n" : "";
    await handle.write(`${separator}${line}\n`);
  } finally {
    await handle.close();
  }
}

async function endsWithNewline(handle: FileHandle, size: number): Promise<boolean> {
  const last = Buffer.alloc(1);
  await handle.read(last, 0, 1, size - 1);
  return last[0] === 0x0a;
}
