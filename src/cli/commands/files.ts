/** `forkd files put|get|ls|stat|rm`: files inside a sandbox, through the daemon. */
import { readFile, rename, rm, writeFile } from "node:fs/promises";
import type { Command } from "commander";
import { InvalidArgumentError } from "commander";
import { FILE_MODE_PATTERN } from "../../common/limits.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { oneLine, printJson, printTable } from "../output.js";

export function registerFiles(program: Command): void {
  const files = program.command("files").description("files inside a sandbox (daemon)");
  registerPut(files);
  registerGet(files);
  registerList(files);
  registerStat(files);
  registerRemove(files);
}

function registerPut(files: Command): void {
  addDaemonOptions(
    files
      .command("put")
      .description("write a local file (or - for stdin) into the sandbox")
      .argument("<id>", "sandbox id")
      .argument("<local>", "local file, or - for stdin")
      .argument("<path>", "absolute path in the sandbox")
      .option("--mode <octal>", "permission bits, e.g. 0755", parseMode),
  ).action((id: string, local: string, target: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const data = await readFile(local === "-" ? "/dev/stdin" : local);
      const answer = await controller.writeFile(id, target, data, {
        ...(opts.mode === undefined ? {} : { mode: opts.mode }),
        signal,
      });
      process.stderr.write(`wrote ${answer.bytes} bytes to ${id}:${answer.path}\n`);
      return undefined;
    }),
  );
}

function registerGet(files: Command): void {
  addDaemonOptions(
    files
      .command("get")
      .description("read a file from the sandbox to stdout or a local file")
      .argument("<id>", "sandbox id")
      .argument("<path>", "absolute path in the sandbox")
      .argument("[local]", "local file to write (default: stdout)"),
  ).action((id: string, source: string, local: string | undefined, _opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const body = await controller.readFile(id, source, { signal });
      if (local === undefined || local === "-") process.stdout.write(body);
      else {
        // Complete or absent: a failed download never leaves a half-written local file.
        const temp = `${local}.forkd-${process.pid}.tmp`;
        try {
          await writeFile(temp, body);
          await rename(temp, local);
        } catch (err) {
          await rm(temp, { force: true });
          throw err;
        }
      }
      return undefined;
    }),
  );
}

function registerList(files: Command): void {
  addDaemonOptions(
    files
      .command("ls")
      .description("list a directory in the sandbox")
      .argument("<id>", "sandbox id")
      .argument("[path]", "absolute directory path", "/")
      .option("--json", "print JSON"),
  ).action((id: string, dir: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const listing = await controller.listFiles(id, dir, { signal });
      if (opts.json) printJson(listing);
      else {
        printTable(
          ["MODE", "SIZE", "MODIFIED", "NAME"],
          listing.entries.map((e) => [
            `${typeLetter(e.type)}${(e.mode & 0o7777).toString(8).padStart(4, "0")}`,
            String(e.size),
            new Date(e.mtime_ms ?? 0).toISOString(),
            oneLine(e.link_target ? `${e.name} -> ${e.link_target}` : e.name, 200),
          ]),
        );
        if (listing.truncated) process.stderr.write("forkd: listing truncated\n");
      }
      return undefined;
    }),
  );
}

function registerStat(files: Command): void {
  addDaemonOptions(
    files
      .command("stat")
      .description("describe a path in the sandbox")
      .argument("<id>", "sandbox id")
      .argument("<path>", "absolute path")
      .option("--json", "print JSON"),
  ).action((id: string, target: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const info = await controller.statFile(id, target, { signal });
      if (opts.json) printJson(info);
      else
        process.stdout.write(
          `${oneLine(target, 200)}: ${info.type}, ${info.size} bytes, mode ${(info.mode & 0o7777).toString(8)}, ` +
            `modified ${new Date(info.mtime_ms ?? 0).toISOString()}${info.link_target ? `, -> ${oneLine(info.link_target, 200)}` : ""}\n`,
        );
      return undefined;
    }),
  );
}

function registerRemove(files: Command): void {
  addDaemonOptions(
    files
      .command("rm")
      .description("remove a file or directory in the sandbox")
      .argument("<id>", "sandbox id")
      .argument("<path>", "absolute path")
      .option("-r, --recursive", "remove a non-empty directory"),
  ).action((id: string, target: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      await controller.removeFile(id, target, { recursive: opts.recursive === true, signal });
      return undefined;
    }),
  );
}

function parseMode(value: string): number {
  if (!new RegExp(FILE_MODE_PATTERN).test(value))
    throw new InvalidArgumentError("expected octal permission bits, e.g. 0644");
  return Number.parseInt(value, 8);
}

function typeLetter(type: string): string {
  return type === "dir" ? "d" : type === "symlink" ? "l" : type === "file" ? "-" : "?";
}
