/**
 * The sandboxes' DNS forwarder over real sockets (loopback stands in for the bridge): each query is answered
 * under the policy of the sandbox it comes from, refused names never reach the upstream, answers for allowed
 * names are pinned before they are sent, AAAA records are dropped, TCP works, garbage gets FORMERR.
 */
import assert from "node:assert/strict";
import dgram from "node:dgram";
import net from "node:net";
import { after, before, describe, it } from "node:test";
import dnsPacket, { type DecodedPacket } from "dns-packet";
import type { HostNetworkConfig } from "../../src/net/config.js";
import { DnsForwarder } from "../../src/net/dns-forwarder.js";
import { compilePolicy, parseEgressPolicy } from "../../src/net/policy.js";
import { type DnsServer, startDnsServer } from "../support/dns-server.js";

const ZONE = {
  "allowed.test": { a: ["198.51.100.10"], ttl: 120 },
  "denied.test": { a: ["198.51.100.11"] },
  "open.test": { a: ["198.51.100.12"] },
};

function ask(port: number, name: string, type: "A" | "AAAA" = "A"): Promise<DecodedPacket> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket("udp4");
    const timer = setTimeout(() => {
      socket.close();
      reject(new Error(`no answer for ${name}`));
    }, 3000);
    socket.on("message", (msg) => {
      clearTimeout(timer);
      socket.close();
      resolve(dnsPacket.decode(msg));
    });
    socket.send(
      dnsPacket.encode({
        type: "query",
        id: 4321,
        flags: dnsPacket.RECURSION_DESIRED,
        questions: [{ type, name }],
      }),
      port,
      "127.0.0.1",
    );
  });
}

const rcode = (p: DecodedPacket) => (p as DecodedPacket & { rcode: string }).rcode;

describe("DNS forwarder", () => {
  let upstream: DnsServer;
  let forwarder: DnsForwarder;
  let port: number;
  const allowed: { addresses: string[]; seconds: number }[] = [];
  let policy = compilePolicy(
    parseEgressPolicy({ default: "deny", allowOut: ["allowed.test"], denyOut: ["denied.test"] }),
  );
  let known = true;

  before(async () => {
    upstream = await startDnsServer(ZONE);
    // A free port for the forwarder: bind, read, release.
    const probe = dgram.createSocket("udp4");
    await new Promise<void>((resolve) => probe.bind(0, "127.0.0.1", () => resolve()));
    port = probe.address().port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const config = {
      bridge: "lo",
      subnet: { address: "127.0.0.0", prefix: 8 },
      bridgeAddress: "127.0.0.1",
      dnsPort: port,
      dnsUpstreams: [{ address: "127.0.0.1", port: upstream.port }],
    } satisfies HostNetworkConfig;
    forwarder = await DnsForwarder.start(config, {
      clientFor: () =>
        known
          ? {
              sandboxId: "sb-000000000001",
              policy,
              allow: async (addresses, seconds) => {
                allowed.push({ addresses, seconds });
              },
            }
          : undefined,
    });
  });
  after(async () => {
    await forwarder.close();
    await upstream.close();
  });

  it("answers an allowed name and pins its addresses with the answer's TTL first", async () => {
    const answer = await ask(port, "Allowed.Test");
    assert.equal(rcode(answer), "NOERROR");
    assert.equal(answer.id, 4321, "the guest's own id comes back");
    assert.deepEqual(
      answer.answers?.map((a) => (a as { data: unknown }).data),
      ["198.51.100.10"],
    );
    assert.deepEqual(allowed.at(-1), { addresses: ["198.51.100.10"], seconds: 120 });
  });

  it("refuses denied names and names the default denies, without asking upstream", async () => {
    const before = upstream.queries.get("denied.test") ?? 0;
    assert.equal(rcode(await ask(port, "denied.test")), "REFUSED");
    assert.equal(rcode(await ask(port, "open.test")), "REFUSED", "default deny");
    assert.equal(upstream.queries.get("denied.test") ?? 0, before);
    assert.equal(upstream.queries.get("open.test"), undefined);
  });

  it("under default allow resolves unnamed names without pinning them, and drops AAAA records", async () => {
    policy = compilePolicy(parseEgressPolicy({ default: "allow", denyOut: ["denied.test"] }));
    const pinned = allowed.length;
    const answer = await ask(port, "open.test");
    assert.equal(rcode(answer), "NOERROR");
    assert.deepEqual(
      answer.answers?.map((a) => (a as { data: unknown }).data),
      ["198.51.100.12"],
    );
    assert.equal(allowed.length, pinned, "nothing pinned: the address is reachable by default");
    const v6 = await ask(port, "open.test", "AAAA");
    assert.equal(rcode(v6), "NOERROR");
    assert.deepEqual(v6.answers, [], "guests have no IPv6");
    assert.equal(rcode(await ask(port, "nowhere.test")), "NXDOMAIN", "the upstream's own answer");
  });

  it("answers over TCP too", async () => {
    const answer = await new Promise<DecodedPacket>((resolve, reject) => {
      const socket = net.connect(port, "127.0.0.1", () =>
        socket.write(
          dnsPacket.streamEncode({ type: "query", id: 7, questions: [{ type: "A", name: "open.test" }] }),
        ),
      );
      socket.once("data", (data: Buffer) => {
        socket.destroy();
        resolve(dnsPacket.decode(data.subarray(2)));
      });
      socket.once("error", reject);
    });
    assert.equal(answer.id, 7);
    assert.deepEqual(
      answer.answers?.map((a) => (a as { data: unknown }).data),
      ["198.51.100.12"],
    );
  });

  it("answers garbage with FORMERR and stays silent for unknown sources", async () => {
    const reply = await new Promise<Buffer>((resolve) => {
      const socket = dgram.createSocket("udp4");
      socket.on("message", (msg) => {
        socket.close();
        resolve(msg);
      });
      socket.send(Buffer.from([0x12, 0x34, 0xff, 0xff, 0x00]), port, "127.0.0.1");
    });
    assert.equal(reply.readUInt16BE(0), 0x1234);
    assert.equal(reply.readUInt16BE(2) & 0xf, 1, "FORMERR");
    known = false;
    await assert.rejects(ask(port, "open.test"), /no answer/);
    known = true;
  });
});
