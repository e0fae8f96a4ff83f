/**
 * `forkd mcp`: the MCP server (src/mcp) on stdio (the default: MCP clients start it) or Streamable HTTP
 * (`--http [host:]port`, loopback unless a host is given, always with a bearer token). It reaches the daemon through
 * the SDK, at --daemon-url / FORKD_URL (token --daemon-token / FORKD_TOKEN).
 */
import type { Command } from "commander";
import { errorMessage, invalidArgument } from "../../common/errors.js";
import { checkToken, isLoopback, loadTokens, serveHttp } from "../../mcp/http.js";
import { serveStdio } from "../../mcp/stdio.js";
import { Controller } from "../../sdk/index.js";
import { EXIT } from "../exit-codes.js";

interface McpOptions {
  http?: string;
  tokenFile?: string;
}

export function registerMcp(program: Command): void {
  program
    .command("mcp")
    .description("run forkd's MCP server (tools for models to drive sandboxes) on stdio, or HTTP with --http")
    .option(
      "--http <[host:]port>",
      "serve MCP Streamable HTTP at http://host:port/mcp (host default 127.0.0.1)",
    )
    .option(
      "--token-file <file>",
      "bearer tokens the HTTP transport accepts, one per line (or env FORKD_MCP_TOKEN)",
    )
    .addHelpText(
      "after",
      "\nThe daemon is reached at --daemon-url / FORKD_URL (default its Unix socket), token --daemon-token / " +
        "FORKD_TOKEN.\nConfiguration for MCP clients: docs/mcp.md.\n",
    )
    .action(async (opts: McpOptions, command: Command) => {
      const log = (line: string) => process.stderr.write(`forkd mcp: ${line}\n`);
      try {
        const { daemonUrl, daemonToken } = command.optsWithGlobals() as {
          daemonUrl?: string;
          daemonToken?: string;
        };
        // The SDK reads FORKD_URL and FORKD_TOKEN itself when no flag names them.
        const controller = new Controller({ url: daemonUrl, token: daemonToken, ...requestTimeoutFromEnv() });
        if (opts.http === undefined) {
          await serveStdio(controller);
          // The client closed stdin: the session (and its background commands) ended.
          process.exit(EXIT.ok);
        }
        const { host, port } = parseListen(opts.http);
        const tokens = opts.tokenFile ? await loadTokens(opts.tokenFile) : tokenFromEnv();
        if (!isLoopback(host))
          log(`listening on ${host}, beyond loopback: every request still needs the token`);
        const running = await serveHttp({ host, port, tokens, controller, log });
        log(`MCP over HTTP at ${running.url} (daemon ${controller.settings().address.display})`);
        const stop = async () => {
          await running.close();
          process.exit(EXIT.ok);
        };
        process.once("SIGINT", () => void stop());
        process.once("SIGTERM", () => void stop());
      } catch (err) {
        log(errorMessage(err));
        process.exit(EXIT.usage);
      }
    });
}

/** forkd v0.5's MCP server read FORKD_HTTP_TIMEOUT (seconds per daemon request); so does this one. */
function requestTimeoutFromEnv(): { requestTimeoutMs?: number } {
  const value = process.env.FORKD_HTTP_TIMEOUT?.trim();
  if (!value) return {};
  const seconds = Number(value);
  if (!Number.isFinite(seconds) || seconds < 0 || seconds > 2_000_000) {
    throw invalidArgument(
      `FORKD_HTTP_TIMEOUT is ${JSON.stringify(value)}: expected seconds, e.g. 60 (0: none)`,
    );
  }
  return { requestTimeoutMs: Math.round(seconds * 1000) };
}

function tokenFromEnv(): string[] {
  const token = process.env.FORKD_MCP_TOKEN?.trim();
  if (!token) {
    throw invalidArgument(
      "the MCP HTTP transport needs a token: --token-file FILE (one token per line) or FORKD_MCP_TOKEN, e.g. " +
        "`head -c 24 /dev/urandom | base64 > mcp-token`",
    );
  }
  checkToken(token, "FORKD_MCP_TOKEN");
  return [token];
}

/** `8890`, `127.0.0.1:8890`, `[::1]:8890`, `0.0.0.0:8890`. */
export function parseListen(value: string): { host: string; port: number } {
  const match = /^(?:(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):)?(\d{1,5})$/.exec(value);
  const port = Number(match?.[2]);
  if (!match || !Number.isInteger(port) || port > 65535) {
    throw invalidArgument(`--http ${value}: expected [host:]port, e.g. 8890 or 127.0.0.1:8890`);
  }
  return { host: (match[1] ?? "127.0.0.1").replace(/^\[(.*)\]$/, "$1"), port };
}
