/**
 * MCP sessions across gateway replicas. A session lives in the replica that opened it (its server, outputs and
 * background commands are there), but a Service spreads a client's connections over every replica. So each
 * replica names its sessions `<uuid>.<its address>.<mac>` — the address where the other replicas reach it
 * (`--advertise-address`), sealed with a key derived from the cluster credential, which every replica holds and
 * no user does — and relays a request for a session another replica opened to that replica, as it came (the
 * bearer token is checked here first and again there). A request already relayed once is never relayed again,
 * and a session whose replica is gone, or whose name was not sealed by a replica, gets MCP's 404: the client
 * initializes again. Nothing is written to the cluster per session.
 */
import { createHmac, randomUUID, timingSafeEqual } from "node:crypto";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import https from "node:https";
import { createProxyServer } from "http-proxy-3";
import { errorMessage } from "../common/errors.js";
import type { SessionRouting } from "../mcp/http.js";

/** Set on a request one replica relays to another: the receiver serves it or answers 404, never relays it on. */
export const RELAYED_HEADER = "forkd-mcp-relayed";
const KEY_PURPOSE = "forkd gateway: MCP session names";
const MAC_BYTES = 16;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const BASE64URL = /^[A-Za-z0-9_-]{1,512}$/;

export class McpSessionRouting implements SessionRouting {
  private readonly key: Buffer;
  private readonly own: string;
  private readonly proxy = createProxyServer({ xfwd: false });
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

  /** `ownUrl`: this replica's origin as its peers reach it (http://10.1.2.3:8080). */
  constructor(
    clusterCredential: string,
    ownUrl: string,
    private readonly log: (line: string) => void,
  ) {
    this.key = createHmac("sha256", clusterCredential).update(KEY_PURPOSE).digest();
    this.own = encodeOrigin(peerOrigin(ownUrl));
    // A caller's socket error is re-emitted on the proxy; with no listener it would end the gateway.
    this.proxy.on("error", (err: Error) => this.log(`MCP relay: ${errorMessage(err)}`));
  }

  newId(): string {
    const head = `${randomUUID()}.${this.own}`;
    return `${head}.${this.mac(head)}`;
  }

  /** The origin of the replica that opened `sessionId`, or undefined when no replica sealed that name. */
  ownerOf(sessionId: string): string | undefined {
    const parts = sessionId.split(".");
    if (parts.length !== 3) return undefined;
    const [uuid, origin, mac] = parts as [string, string, string];
    if (!UUID.test(uuid) || !BASE64URL.test(origin) || !BASE64URL.test(mac)) return undefined;
    const expected = Buffer.from(this.mac(`${uuid}.${origin}`), "base64url");
    const presented = Buffer.from(mac, "base64url");
    if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) return undefined;
    return Buffer.from(origin, "base64url").toString("utf8");
  }

  async elsewhere(sessionId: string, request: IncomingMessage, response: ServerResponse): Promise<boolean> {
    if (request.headers[RELAYED_HEADER] !== undefined) return false;
    const owner = this.ownerOf(sessionId);
    if (owner === undefined || encodeOrigin(owner) === this.own) return false;
    return this.relay(owner, request, response);
  }

  close(): void {
    this.proxy.close();
    this.agent.destroy();
  }

  /** Relays the request to `owner`; false when it could not be reached before anything was answered. */
  private relay(owner: string, request: IncomingMessage, response: ServerResponse): Promise<boolean> {
    // The Host becomes the peer's own address, which its listener answers whatever names it was given (this
    // replica checked the client's already). Over TLS the peer's certificate is checked against the name the
    // client asked for, as the client checked this replica's.
    const tls = new URL(owner).protocol === "https:";
    const agent = tls ? new https.Agent({ servername: hostName(request.headers.host) }) : this.agent;
    return new Promise((resolve) => {
      response.once("close", () => {
        if (tls) agent.destroy();
        resolve(true);
      });
      this.proxy.web(
        request,
        response,
        { target: owner, toProxy: true, changeOrigin: true, headers: { [RELAYED_HEADER]: "1" }, agent },
        (err) => {
          this.log(`MCP session's replica ${owner} did not answer: ${errorMessage(err)}`);
          if (response.headersSent) {
            response.destroy();
            resolve(true);
          } else resolve(false);
        },
      );
    });
  }

  private mac(head: string): string {
    return createHmac("sha256", this.key).update(head).digest().subarray(0, MAC_BYTES).toString("base64url");
  }
}

/** The URL for a replica's `--advertise-address` (an IP or host name) on its listener's scheme and port. */
export function advertisedUrl(address: string, port: number, tls: boolean): string {
  const host = address.includes(":") && !address.startsWith("[") ? `[${address}]` : address;
  return peerOrigin(`${tls ? "https" : "http"}://${host}:${port}`);
}

/** `url` as an origin (scheme, host, port), refusing anything else a peer address cannot be. */
function peerOrigin(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`not a URL: ${JSON.stringify(url)}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:")
    throw new Error(`a gateway replica's address is http or https, not ${parsed.protocol}`);
  if (parsed.username || parsed.password || parsed.pathname !== "/" || parsed.search || parsed.hash)
    throw new Error(`a gateway replica's address is scheme, host and port only: ${JSON.stringify(url)}`);
  return parsed.origin;
}

/** The name in a Host header, without its port (IPv6 addresses without their brackets). */
function hostName(host: string | undefined): string | undefined {
  const match = /^(?:\[([^\]]+)\]|([^:]+))(?::\d+)?$/.exec(host ?? "");
  return match?.[1] ?? match?.[2];
}

function encodeOrigin(origin: string): string {
  return Buffer.from(origin, "utf8").toString("base64url");
}
