/**
 * One MCP session's server: forkd's tools (tools.ts), forkd v0.5's tool names (v05-tools.ts), and resources for
 * output too long for a tool result (`forkd://outputs/<n>`) and for background commands (`forkd://commands/<n>`).
 * It reaches the daemon only through the TypeScript SDK's Controller.
 */
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { type Controller, SDK_VERSION } from "../sdk/index.js";
import { COMMAND_URI_PREFIX, CommandRunner } from "./commands.js";
import { OUTPUT_URI_PREFIX, OutputStore } from "./outputs.js";
import { registerTools } from "./tools.js";
import { registerV05Tools } from "./v05-tools.js";

export const SERVER_NAME = "forkd";

const INSTRUCTIONS =
  "forkd runs sandboxes: microVMs forked copy-on-write from warm snapshots. Typical use: list_snapshots, " +
  "create_sandboxes from one (e.g. pyagent, Python with numpy loaded), run_command / run_code / read_file / " +
  "write_file in it, fork_sandbox to continue from a point in several sandboxes at once, kill_sandbox when done. " +
  "Long output is cut in tool results; the full text is a resource (forkd://outputs/<n>).";

export interface ForkdMcpSession {
  server: McpServer;
  /** Ends the session's background commands. */
  close(): Promise<void>;
}

export function createMcpSession(controller: Controller): ForkdMcpSession {
  const server = new McpServer(
    { name: SERVER_NAME, version: SDK_VERSION },
    { capabilities: { resources: {}, tools: {} }, instructions: INSTRUCTIONS },
  );
  const outputs = new OutputStore();
  const commands = new CommandRunner(controller);
  registerTools(server, { controller, outputs, commands });
  registerV05Tools(server, { controller, outputs, commands });

  server.registerResource(
    "output",
    new ResourceTemplate(`${OUTPUT_URI_PREFIX}{id}`, {
      list: () => ({
        resources: outputs
          .list()
          .map((o) => ({ uri: o.uri, name: o.uri, description: o.description, mimeType: "text/plain" })),
      }),
    }),
    { description: "The full text of a tool result that was cut.", mimeType: "text/plain" },
    (uri) => {
      const stored = outputs.get(uri.href);
      if (!stored)
        throw new Error(
          `no output ${uri.href} in this session (outputs are kept per session, oldest dropped)`,
        );
      return { contents: [{ uri: uri.href, mimeType: "text/plain", text: stored.text }] };
    },
  );
  server.registerResource(
    "command",
    new ResourceTemplate(`${COMMAND_URI_PREFIX}{id}`, {
      list: () => ({
        resources: commands.ids().map((id) => ({
          uri: `${COMMAND_URI_PREFIX}${id}`,
          name: `command ${id}`,
          mimeType: "application/json",
        })),
      }),
    }),
    {
      description:
        "A background command of run_command (wait_for_text): whether it runs, and its output so far.",
      mimeType: "application/json",
    },
    (uri, variables) => {
      const state = commands.describe(String(variables.id));
      return { contents: [{ uri: uri.href, mimeType: "application/json", text: JSON.stringify(state) }] };
    },
  );
  return {
    server,
    close: async () => {
      await commands.close();
      await server.close();
    },
  };
}
