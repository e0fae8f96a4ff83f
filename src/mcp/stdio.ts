/**
 * The MCP stdio transport: one session on this process's stdin/stdout (how MCP clients usually start a server).
 * stdout carries only protocol messages; anything else goes to stderr. The session (and its background commands)
 * ends when stdin closes.
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import type { Controller } from "../sdk/index.js";
import { createMcpSession } from "./server.js";

export async function serveStdio(controller: Controller): Promise<void> {
  const session = createMcpSession(controller);
  const transport = new StdioServerTransport();
  const closed = new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
    process.stdin.once("end", () => resolve());
  });
  await session.server.connect(transport);
  await closed;
  await session.close();
}
