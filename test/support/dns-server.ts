/**
 * A small authoritative DNS server of the tests' own (UDP and TCP, dns-packet): answers A (and an AAAA, so the
 * forwarder's IPv6 filtering is visible) for the names in its zone, NXDOMAIN for the rest, and counts the
 * queries per name so a test can tell whether the forwarder asked at all.
 */
import dgram from "node:dgram";
import net from "node:net";
import dnsPacket, { type Answer, type Packet } from "dns-packet";

export type Zone = Record<string, { a: string[]; ttl?: number }>;

export interface DnsServer {
  port: number;
  queries: Map<string, number>;
  close(): Promise<void>;
}

export function answerFor(zone: Zone, query: Packet): Buffer {
  const question = query.questions?.[0];
  const name = question?.name.toLowerCase() ?? "";
  const entry = zone[name];
  const answers: Answer[] = [];
  if (entry && question?.type === "A") {
    for (const a of entry.a) answers.push({ type: "A", name: question.name, ttl: entry.ttl ?? 60, data: a });
  }
  if (entry && question?.type === "AAAA") {
    answers.push({ type: "AAAA", name: question.name, ttl: entry.ttl ?? 60, data: "2001:db8::1" });
  }
  return dnsPacket.encode({
    type: "response",
    id: query.id,
    flags: dnsPacket.AUTHORITATIVE_ANSWER | (entry ? 0 : 3),
    questions: query.questions,
    answers,
  });
}

export async function startDnsServer(zone: Zone, address = "127.0.0.1", port = 0): Promise<DnsServer> {
  const queries = new Map<string, number>();
  const count = (packet: Packet) => {
    const name = packet.questions?.[0]?.name.toLowerCase() ?? "";
    queries.set(name, (queries.get(name) ?? 0) + 1);
  };
  const udp = dgram.createSocket("udp4");
  udp.on("message", (msg, rinfo) => {
    const query = dnsPacket.decode(msg);
    count(query);
    udp.send(answerFor(zone, query), rinfo.port, rinfo.address);
  });
  await new Promise<void>((resolve) => udp.bind(port, address, () => resolve()));
  const bound = udp.address().port;
  const tcp = net.createServer((socket) => {
    socket.on("error", () => {});
    socket.once("data", (data: Buffer) => {
      const query = dnsPacket.streamDecode(data);
      count(query);
      socket.end(dnsPacket.streamEncode(dnsPacket.decode(answerFor(zone, query))));
    });
  });
  await new Promise<void>((resolve) => tcp.listen(bound, address, () => resolve()));
  return {
    port: bound,
    queries,
    close: async () => {
      await new Promise<void>((resolve) => udp.close(() => resolve()));
      await new Promise<void>((resolve) => tcp.close(() => resolve()));
    },
  };
}
