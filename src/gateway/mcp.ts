/**
 * MCP over HTTP at the gateway (/mcp): forkd's MCP server (src/mcp), one session per client, whose tools call
 * this gateway's own REST API with the token the client presented: a tenant's session sees and places only that
 * tenant's sandboxes, across the cluster, exactly as the forkd API through the gateway does. With an advertised
 * address, a session opened at another replica is relayed there (mcp-sessions.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { matchToken } from "../common/tokens.js";
import { MCP_PATH, McpListener } from "../mcp/http.js";
import { Controller } from "../sdk/index.js";
import type { GatewayContext } from "./context.js";
import { McpSessionRouting } from "./mcp-sessions.js";

export class GatewayMcp {
  private readonly listener: McpListener;
  private readonly clients = new Map<string, Controller>();
  private readonly sweeper: NodeJS.Timeout;
  private readonly routing: McpSessionRouting | undefined;

  /** `peerUrl`: where the other replicas reach this one (none: sessions are served by the replica only). */
  constructor(context: GatewayContext, ownUrl: () => string, peerUrl?: string) {
    const log = (line: string) => context.logger.info(line);
    this.routing = peerUrl === undefined ? undefined : new McpSessionRouting(context.nodeToken, peerUrl, log);
    this.listener = new McpListener(
      (token) => {
        const known = matchToken(token, context.auth.tokens);
        if (!known) return undefined;
        let client = this.clients.get(known.digest.toString("hex"));
        if (!client) {
          client = new Controller({ url: ownUrl(), token, env: {} });
          this.clients.set(known.digest.toString("hex"), client);
        }
        return client;
      },
      undefined,
      log,
      this.routing,
    );
    this.sweeper = setInterval(() => this.listener.closeIdle(), 60_000);
    this.sweeper.unref();
  }

  handles(url: string): boolean {
    return url.split("?")[0] === MCP_PATH;
  }

  handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    return this.listener.handle(req, res);
  }

  async close(): Promise<void> {
    clearInterval(this.sweeper);
    await this.listener.closeAll();
    this.routing?.close();
  }
}
