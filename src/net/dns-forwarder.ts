/**
 * The sandboxes' resolver. One forwarder (UDP and TCP on the bridge address) serves every sandbox of a daemon;
 * each query is attributed to a sandbox by the address it arrives from (a namespace's own address: the guest's
 * traffic is SNATed to it, and the host rules drop anything on the bridge from outside the sandbox subnet, so
 * the address cannot be forged), and answered under that sandbox's policy:
 *   - a name the policy does not let resolve gets REFUSED (nothing is sent upstream);
 *   - an allowed name is forwarded to the host's resolvers; if an allow entry names it, the IPv4 addresses in
 *     the answer become reachable from that sandbox for the answer's TTL before the answer is sent, so the
 *     connection that follows the lookup is never dropped.
 * Guests have no IPv6: AAAA records are removed from answers. Queries are re-encoded with a fresh id on a
 * fresh socket (a guest chooses neither), answers are size-checked, and every buffer is bounded.
 */

import { randomInt } from "node:crypto";
import dgram from "node:dgram";
import net from "node:net";
import dnsPacket, {
  type Answer,
  type DecodedPacket,
  type Packet,
  type Question,
  type StringAnswer,
} from "dns-packet";
import { errorMessage } from "../common/errors.js";
import type { DnsUpstream, HostNetworkConfig } from "./config.js";
import { type CompiledPolicy, nameIsAllowed, nameIsExplicitlyAllowed, normalizeName } from "./policy.js";

export const UPSTREAM_TIMEOUT_MS = 2500;
/** Classic DNS over UDP without EDNS: larger answers are truncated (TC) and the client retries over TCP. */
export const MAX_UDP_ANSWER_BYTES = 512;
export const MAX_TCP_MESSAGE_BYTES = 65535;
/** Queries one sandbox may have in flight; more are dropped (a stub resolver retries). */
export const MAX_PENDING_PER_SANDBOX = 64;
export const MAX_TCP_CONNECTIONS_PER_SANDBOX = 16;
export const TCP_IDLE_TIMEOUT_MS = 10_000;

const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NOTIMP: 4, REFUSED: 5 } as const;
const RCODE_MASK = 0xf;

/** What the forwarder needs to know about the sandbox behind a source address. */
export interface DnsClient {
  sandboxId: string;
  policy: CompiledPolicy;
  /** Makes `addresses` reachable from this sandbox for `seconds`; resolves once they are. */
  allow(addresses: string[], seconds: number): Promise<void>;
}

export interface DnsForwarderOptions {
  clientFor(address: string): DnsClient | undefined;
  log?: { warn(obj: object, msg: string): void };
}

export class DnsForwarder {
  private readonly pending = new Map<string, number>();
  private readonly tcpConnections = new Map<string, number>();
  private readonly sockets = new Set<net.Socket>();

  private constructor(
    private readonly config: HostNetworkConfig,
    private readonly options: DnsForwarderOptions,
    private readonly udp: dgram.Socket,
    private readonly tcp: net.Server,
  ) {}

  /** Listens on the bridge address (which must exist: after host setup). */
  static async start(config: HostNetworkConfig, options: DnsForwarderOptions): Promise<DnsForwarder> {
    const udp = dgram.createSocket({ type: "udp4" });
    const tcp = net.createServer();
    const forwarder = new DnsForwarder(config, options, udp, tcp);
    udp.on("message", (msg, rinfo) => forwarder.onUdp(msg, rinfo));
    udp.on("error", (err) => options.log?.warn({ err: errorMessage(err) }, "DNS forwarder UDP error"));
    tcp.on("connection", (socket) => forwarder.onTcp(socket));
    try {
      await new Promise<void>((resolve, reject) => {
        udp.once("error", reject);
        udp.bind({ address: config.bridgeAddress, port: config.dnsPort, exclusive: true }, () => {
          udp.off("error", reject);
          resolve();
        });
      });
      await new Promise<void>((resolve, reject) => {
        tcp.once("error", reject);
        tcp.listen({ host: config.bridgeAddress, port: config.dnsPort, exclusive: true }, () => {
          tcp.off("error", reject);
          resolve();
        });
      });
    } catch (err) {
      udp.close();
      tcp.close();
      throw err;
    }
    return forwarder;
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await Promise.all([
      new Promise<void>((resolve) => this.udp.close(() => resolve())),
      new Promise<void>((resolve) => this.tcp.close(() => resolve())),
    ]);
  }

  private onUdp(message: Buffer, rinfo: dgram.RemoteInfo): void {
    const client = this.options.clientFor(rinfo.address);
    if (!client || !this.admit(rinfo.address)) return;
    this.answer(client, message, MAX_UDP_ANSWER_BYTES)
      .then((reply) => {
        if (reply) this.udp.send(reply, rinfo.port, rinfo.address);
      })
      .finally(() => this.release(rinfo.address));
  }

  private onTcp(socket: net.Socket): void {
    const address = socket.remoteAddress?.replace(/^::ffff:/, "") ?? "";
    const client = this.options.clientFor(address);
    const open = this.tcpConnections.get(address) ?? 0;
    if (!client || open >= MAX_TCP_CONNECTIONS_PER_SANDBOX) {
      socket.destroy();
      return;
    }
    this.tcpConnections.set(address, open + 1);
    this.sockets.add(socket);
    socket.setTimeout(TCP_IDLE_TIMEOUT_MS, () => socket.destroy());
    socket.on("error", () => {});
    socket.on("close", () => {
      this.sockets.delete(socket);
      const left = (this.tcpConnections.get(address) ?? 1) - 1;
      if (left > 0) this.tcpConnections.set(address, left);
      else this.tcpConnections.delete(address);
    });
    let buffered = Buffer.alloc(0);
    socket.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2) {
        const length = buffered.readUInt16BE(0);
        if (buffered.length < 2 + length) break;
        const message = buffered.subarray(2, 2 + length);
        buffered = buffered.subarray(2 + length);
        if (!this.admit(address)) continue;
        this.answer(client, Buffer.from(message), MAX_TCP_MESSAGE_BYTES)
          .then((reply) => {
            if (!reply || socket.destroyed) return;
            const framed = Buffer.alloc(2 + reply.length);
            framed.writeUInt16BE(reply.length, 0);
            reply.copy(framed, 2);
            socket.write(framed);
          })
          .finally(() => this.release(address));
      }
      // One message is at most 64 KiB + 2; anything longer is not DNS.
      if (buffered.length > MAX_TCP_MESSAGE_BYTES + 2) socket.destroy();
    });
  }

  private admit(address: string): boolean {
    const n = this.pending.get(address) ?? 0;
    if (n >= MAX_PENDING_PER_SANDBOX) return false;
    this.pending.set(address, n + 1);
    return true;
  }

  private release(address: string): void {
    const n = (this.pending.get(address) ?? 1) - 1;
    if (n > 0) this.pending.set(address, n);
    else this.pending.delete(address);
  }

  /** The reply to one query from `client`, or null to stay silent (not a query at all). */
  private async answer(client: DnsClient, message: Buffer, maxBytes: number): Promise<Buffer | null> {
    let query: DecodedPacket;
    try {
      query = dnsPacket.decode(message);
    } catch {
      return message.length >= 2 ? errorReply(message.readUInt16BE(0), [], RCODE.FORMERR) : null;
    }
    if (query.type !== "query") return null;
    const id = query.id ?? 0;
    const questions = query.questions ?? [];
    const question = questions[0];
    if ((query as { opcode?: string }).opcode !== "QUERY") return errorReply(id, questions, RCODE.NOTIMP);
    if (questions.length !== 1 || !question) return errorReply(id, questions, RCODE.FORMERR);
    const name = normalizeName(question.name);
    if (!name || !nameIsAllowed(client.policy, name)) return errorReply(id, questions, RCODE.REFUSED);
    let upstream: DecodedPacket;
    try {
      upstream = await this.resolve({ type: question.type, class: question.class, name });
    } catch (err) {
      this.options.log?.warn(
        { sandbox: client.sandboxId, name, err: errorMessage(err) },
        "DNS upstream failed",
      );
      return errorReply(id, questions, RCODE.SERVFAIL);
    }
    const answers = (upstream.answers ?? []).filter((a) => a.type !== "AAAA");
    if (nameIsExplicitlyAllowed(client.policy, name)) {
      const records = answers.filter(isAddressRecord);
      const ttl = Math.min(...records.map((a) => a.ttl ?? 0));
      try {
        await client.allow([...new Set(records.map((a) => a.data))], Number.isFinite(ttl) ? ttl : 0);
      } catch (err) {
        this.options.log?.warn(
          { sandbox: client.sandboxId, name, err: errorMessage(err) },
          "DNS allow failed",
        );
        return errorReply(id, questions, RCODE.SERVFAIL);
      }
    }
    const reply: Packet = {
      type: "response",
      id,
      flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | rcodeOf(upstream),
      questions: [{ type: question.type, class: question.class, name: question.name }],
      answers,
      authorities: (upstream.authorities ?? []).filter((a) => a.type !== "AAAA"),
      additionals: (upstream.additionals ?? []).filter((a) => a.type !== "AAAA" && a.type !== "OPT"),
    };
    const encoded = dnsPacket.encode(reply);
    if (encoded.length <= maxBytes) return encoded;
    return dnsPacket.encode({
      ...reply,
      flags: (reply.flags ?? 0) | dnsPacket.TRUNCATED_RESPONSE,
      answers: [],
      authorities: [],
      additionals: [],
    });
  }

  /** Asks the upstream resolvers in order (UDP, then TCP when the answer was truncated). */
  private async resolve(question: Question): Promise<DecodedPacket> {
    let lastError: unknown = new Error("no DNS upstream configured");
    for (const upstream of this.config.dnsUpstreams) {
      const id = randomInt(0, 0x10000);
      const query = dnsPacket.encode({
        type: "query",
        id,
        flags: dnsPacket.RECURSION_DESIRED,
        questions: [question],
      });
      try {
        let response = await udpExchange(upstream, query);
        if (response.flag_tc) response = await tcpExchange(upstream, query);
        checkResponse(response, id, question);
        return response;
      } catch (err) {
        lastError = err;
      }
    }
    throw lastError;
  }
}

function isAddressRecord(answer: Answer): answer is StringAnswer {
  return answer.type === "A" && typeof (answer as StringAnswer).data === "string";
}

function rcodeOf(packet: DecodedPacket): number {
  return (packet.flags ?? 0) & RCODE_MASK;
}

function errorReply(id: number, questions: Question[], rcode: number): Buffer {
  return dnsPacket.encode({
    type: "response",
    id,
    flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | rcode,
    questions: questions.slice(0, 1),
  });
}

function checkResponse(response: DecodedPacket, id: number, question: Question): void {
  const q = response.questions?.[0];
  if (response.id !== id || response.type !== "response" || !q || q.type !== question.type) {
    throw new Error("upstream answered a different query");
  }
  if (normalizeName(q.name) !== normalizeName(question.name))
    throw new Error("upstream answered another name");
}

function udpExchange(upstream: DnsUpstream, query: Buffer): Promise<DecodedPacket> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket("udp4");
    const done = (err: Error | null, packet?: DecodedPacket) => {
      clearTimeout(timer);
      socket.close();
      if (err) reject(err);
      else resolve(packet as DecodedPacket);
    };
    const timer = setTimeout(
      () => done(new Error(`no answer from ${upstream.address}`)),
      UPSTREAM_TIMEOUT_MS,
    );
    socket.on("error", (err) => done(err));
    socket.on("message", (msg, rinfo) => {
      if (rinfo.address !== upstream.address || rinfo.port !== upstream.port) return;
      try {
        done(null, dnsPacket.decode(msg));
      } catch (err) {
        done(err as Error);
      }
    });
    socket.connect(upstream.port, upstream.address, () => socket.send(query));
  });
}

function tcpExchange(upstream: DnsUpstream, query: Buffer): Promise<DecodedPacket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: upstream.address, port: upstream.port });
    let buffered = Buffer.alloc(0);
    const done = (err: Error | null, packet?: DecodedPacket) => {
      socket.destroy();
      if (err) reject(err);
      else resolve(packet as DecodedPacket);
    };
    socket.setTimeout(UPSTREAM_TIMEOUT_MS, () => done(new Error(`no TCP answer from ${upstream.address}`)));
    socket.on("error", (err) => done(err));
    socket.on("connect", () => {
      const framed = Buffer.alloc(2 + query.length);
      framed.writeUInt16BE(query.length, 0);
      query.copy(framed, 2);
      socket.write(framed);
    });
    socket.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (buffered.length > MAX_TCP_MESSAGE_BYTES + 2) return done(new Error("oversized TCP answer"));
      if (buffered.length < 2 || buffered.length < 2 + buffered.readUInt16BE(0)) return;
      try {
        done(null, dnsPacket.decode(buffered.subarray(2, 2 + buffered.readUInt16BE(0))));
      } catch (err) {
        done(err as Error);
      }
    });
  });
}
