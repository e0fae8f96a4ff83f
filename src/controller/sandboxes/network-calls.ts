/**
 * The network side of the sandbox service: how the daemon networks its sandboxes, a running sandbox's egress
 * policy changes, and traffic to its ports through the daemon's port proxy (under its inbound settings). The
 * networks themselves are ../networks' SandboxNetworks.
 */

import type http from "node:http";
import type net from "node:net";
import { errorMessage, invalidArgument } from "../../common/errors.js";
import type { EgressPolicy, EgressPolicyInput } from "../../net/policy.js";
import { PortProxy, type PortTarget } from "../../net/port-proxy.js";
import type { SandboxRow } from "../../store/db.js";
import type { SnapshotStore } from "../../store/snapshot-store.js";
import { type NetworkRequest, type SandboxNetworks, templateEgressOf } from "../networks/sandbox-networks.js";
import type { NetworkStatus } from "../sandbox-service.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import { hostHeaderFor, parseInbound } from "./settings.js";
import { isIntIn } from "./spawn-request.js";

export interface NetworkCallsContext {
  networks: SandboxNetworks;
  live: Pick<LiveSandboxes, "row" | "running">;
  store: Pick<SnapshotStore, "get">;
  /** Hears of each proxied connection that failed (the proxy goes on serving the others). */
  log: { warn(obj: object, msg?: string): void };
}

export class NetworkCalls {
  private readonly portProxy = new PortProxy((err, target) =>
    this.ctx.log.warn(
      { err: errorMessage(err), sandbox: target?.owner, port: target?.port },
      "a proxied connection failed",
    ),
  );

  constructor(private readonly ctx: NetworkCallsContext) {}

  /** How this daemon networks its sandboxes (for status and doctor). */
  status(): NetworkStatus {
    const { networks } = this.ctx;
    const { config } = networks;
    return {
      mode: networks.mode,
      reason: networks.reason,
      bridge: networks.mode === "netns" ? config.bridge : null,
      subnet: networks.mode === "netns" ? `${config.subnet.address}/${config.subnet.prefix}` : null,
      dns: networks.mode === "netns" ? `${config.bridgeAddress}:${config.dnsPort}` : null,
      dns_upstreams: config.dnsUpstreams.map((u) => `${u.address}:${u.port}`),
      default_egress: networks.mode === "netns" ? networks.defaultEgress : "deny",
    };
  }

  /** Replaces sandbox `id`'s egress policy while it runs. */
  async setPolicy(id: string, policy: EgressPolicyInput): Promise<void> {
    this.ctx.live.running(id);
    const template = await this.templateEgressFor(this.ctx.live.row(id).snapshot_tag);
    await this.ctx.networks.setPolicy(id, policy, template);
  }

  /** The egress default of snapshot `tag`'s template (undefined: none, or the snapshot is gone). */
  private async templateEgressFor(tag: string): Promise<EgressPolicy | undefined> {
    const snapshot = await this.ctx.store.get(tag).catch(() => undefined);
    return snapshot && templateEgressOf(snapshot.manifest);
  }

  /** The network request that gives a new sandbox the network `row`'s sandbox has now. */
  networkOf(row: SandboxRow): NetworkRequest {
    if (row.network === "none") return undefined;
    const policy = this.ctx.networks.info(row.id, true).policy;
    return row.network === "private" || policy === null ? "none" : policy;
  }

  /** Proxies one HTTP request (`req.url` is the path in the guest) to TCP port `port` of sandbox `id`. */
  async proxyHttp(
    id: string,
    port: number,
    req: http.IncomingMessage,
    res: http.ServerResponse,
  ): Promise<string | null> {
    return this.portProxy.web(req, res, this.portTarget(id, port));
  }

  /** Proxies a WebSocket (HTTP upgrade) to TCP port `port` of sandbox `id`. */
  proxyUpgrade(id: string, port: number, req: http.IncomingMessage, socket: net.Socket, head: Buffer): void {
    this.portProxy.upgrade(req, socket, head, this.portTarget(id, port));
  }

  private portTarget(id: string, port: number): PortTarget {
    if (!isIntIn(port, 1, 65535)) throw invalidArgument(`port must be an integer in 1..65535, got ${port}`);
    this.ctx.live.running(id);
    const inbound = parseInbound(this.ctx.live.row(id).inbound);
    return {
      ...this.ctx.networks.portTarget(id, port),
      tls: inbound.httpsPorts.includes(port),
      hostHeader: hostHeaderFor(inbound, port),
      owner: id,
    };
  }

  /** Ends the tunnels to sandbox `id`'s ports (before its namespace goes: they would never finish closing). */
  closeTunnels(id: string): void {
    this.portProxy.closeTunnels(id);
  }

  closeProxy(): void {
    this.portProxy.close();
  }
}
