/**
 * forkd-netd, the daemon's network helper: a sandbox network it makes is the same, object for object, as the ip
 * and nft tools make (addresses, routes, neighbours, links, sysctls, rules); removing it leaves nothing; a crash
 * of the helper mid-way fails the pending request and the next one is served by a new helper; it refuses
 * malformed requests, and runs only under the parent that started it. Real namespaces on a bridge of its own.
 */
import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { packageRoot } from "../../src/common/package-root.js";
import { type Cidr, parseCidr } from "../../src/net/ipv4.js";
import { sandboxNetNames } from "../../src/net/names.js";
import {
  allowResolvedAddresses,
  createSandboxNetwork,
  removeSandboxNetwork,
  sandboxNetworkExists,
} from "../../src/net/namespace.js";
import { NETD_OPS, NetdClient, netdBinary } from "../../src/net/netd-client.js";
import { compilePolicy, parseEgressPolicy } from "../../src/net/policy.js";

const run = promisify(execFile);
const bridge = `fkt${randomBytes(4).toString("hex")}`;
const config = {
  bridge,
  subnet: parseCidr("10.250.16.0/20") as Cidr,
  bridgeAddress: "10.250.16.1",
  dnsPort: 53,
  dnsUpstreams: [],
};
const policy = compilePolicy(parseEgressPolicy({ default: "deny", allowOut: ["192.0.2.0/24"] }));
const sandboxId = () => `sb-${randomBytes(6).toString("hex")}`;

/** Everything observable about a sandbox's network, with what differs between any two sandboxes normalised. */
async function observe(id: string, address: string): Promise<string> {
  const { netns, veth } = sandboxNetNames(id);
  const inNs = async (...args: string[]) => (await run("ip", ["-n", netns, ...args])).stdout;
  const links = JSON.parse(await inNs("-j", "-d", "link", "show")) as Record<string, unknown>[];
  const hostEnd = JSON.parse((await run("ip", ["-j", "-d", "link", "show", "dev", veth])).stdout)[0];
  const sysctl = (key: string) =>
    run("ip", ["netns", "exec", netns, "cat", `/proc/sys/${key.replaceAll(".", "/")}`]).then((r) =>
      r.stdout.trim(),
    );
  const facts = {
    links: links.map((l) => ({
      name: l.ifname,
      flags: l.flags,
      address: l.ifname === "tap0" ? l.address : undefined,
      kind: (l.linkinfo as { info_kind?: string } | undefined)?.info_kind,
      tun: (l.linkinfo as { info_data?: unknown } | undefined)?.info_data,
      addrGenMode: (l as { inet6_addr_gen_mode?: string }).inet6_addr_gen_mode,
    })),
    hostEnd: {
      flags: hostEnd.flags,
      master: hostEnd.master,
      isolated: hostEnd.linkinfo?.info_slave_data?.isolated,
      addrGenMode: hostEnd.inet6_addr_gen_mode,
    },
    // netlink's AddrAdd gives an IPv4 address its broadcast address, `ip address add` does not; nothing in a
    // sandbox namespace answers or forwards broadcasts (its input chain drops them), so that is not compared.
    addresses: (await inNs("-4", "-o", "address", "show")).replace(/ brd \S+/g, ""),
    routes: await inNs("route", "show"),
    neighbours: await inNs("neighbour", "show", "nud", "permanent"),
    sysctls: [
      await sysctl("net.ipv4.ip_forward"),
      await sysctl("net.ipv6.conf.all.disable_ipv6"),
      await sysctl("net.ipv6.conf.default.disable_ipv6"),
    ],
    rules: (await run("ip", ["netns", "exec", netns, "nft", "list", "ruleset"])).stdout.replace(
      /expires \S+/g,
      "expires *",
    ),
  };
  return JSON.stringify(facts, null, 1)
    .replaceAll(address, "<address>")
    .replace(/"\d+: /g, '"N: ');
}

describe("forkd-netd", () => {
  before(async () => {
    await run("ip", ["link", "add", bridge, "type", "bridge"]);
    await run("ip", ["address", "add", "10.250.16.1/20", "dev", bridge]);
    await run("ip", ["link", "set", bridge, "up"]);
  });
  after(async () => {
    await run("ip", ["link", "del", bridge]).catch(() => {});
  });

  it("makes the same network the ip and nft tools make, and removes all of it", async () => {
    const made: Record<string, string> = {};
    for (const [backend, address] of [
      ["tools", "10.250.16.2"],
      ["netd", "10.250.16.3"],
    ] as const) {
      process.env.FORKD_NET_BACKEND = backend;
      const id = sandboxId();
      try {
        await createSandboxNetwork({ sandboxId: id, address, config, policy, generation: 1 });
        await allowResolvedAddresses(id, ["198.51.100.7"], 60);
        made[backend] = await observe(id, address);
      } finally {
        await removeSandboxNetwork(id);
        delete process.env.FORKD_NET_BACKEND;
      }
      assert.equal(await sandboxNetworkExists(id), false, `${backend}: something of ${id} is left`);
      await removeSandboxNetwork(id); // idempotent
    }
    assert.match(made.netd as string, /198\.51\.100\.7/);
    assert.match(made.netd as string, /tap0/);
    assert.equal(made.netd, made.tools);
  });

  it("undoes a create that fails half-way (the bridge is not there)", async () => {
    const id = sandboxId();
    await assert.rejects(
      createSandboxNetwork({
        sandboxId: id,
        address: "10.250.16.4",
        config: { ...config, bridge: "fknosuchbr0" },
        policy,
        generation: 1,
      }),
      /bridge fknosuchbr0/,
    );
    assert.equal(await sandboxNetworkExists(id), false);
  });

  it("fails what is pending when the helper dies, and serves the next request with a new one", async () => {
    const client = new NetdClient();
    const id = sandboxId();
    const { netns, veth } = sandboxNetNames(id);
    await client.request({ op: "remove", netns, veth });
    const helpers = spawnSync("pgrep", ["-P", String(process.pid), "-f", "forkd-netd"], { encoding: "utf8" });
    const pids = helpers.stdout.trim().split("\n").map(Number);
    assert.ok(pids.length >= 1, "no helper process");
    const pending = client.request({ op: "rules", netns: "forkd-sb-000000000000", script: "list ruleset\n" });
    client.stop();
    await assert.rejects(pending, /forkd-netd/);
    await client.request({ op: "remove", netns, veth });
    client.stop();
  });

  it("refuses malformed requests with a clear error and keeps serving", async () => {
    const client = new NetdClient();
    await assert.rejects(
      client.request({ op: "remove", netns: "../etc", veth: "fk1" }),
      /bad namespace name "\.\.\/etc"/,
    );
    await assert.rejects(
      client.request({ op: "link", netns: "forkd-x", veth: "much-too-long-ifname", peer: "up0", bridge }),
      /bad interface name/,
    );
    await assert.rejects(
      client.request({ op: "rules", netns: "forkd-x", script: "x", sysctls: [["kernel.panic", "1"]] }),
      /bad sysctl/,
    );
    await assert.rejects(client.request({ op: "nope" as "link", netns: "forkd-x" }), /unknown operation/);
    await client.request({ op: "remove", netns: "forkd-x", veth: "fkx" });
    client.stop();
  });

  it("ends on a request over its bound, and runs only under the parent it names", () => {
    const long = spawnSync(netdBinary(), ["--max-message=64", `--parent=${process.pid}`], {
      input: `${JSON.stringify({ id: 1, op: "remove", netns: "x".repeat(100), veth: "fk1" })}\n`,
      encoding: "utf8",
    });
    assert.equal(long.status, 1);
    assert.match(long.stderr, /longer than 64 bytes/);
    const stranger = spawnSync(netdBinary(), ["--parent=1"], { input: "", encoding: "utf8" });
    assert.equal(stranger.status, 1);
    assert.match(stranger.stderr, /not by the daemon/);
  });

  it("knows exactly the operations the client declares", () => {
    const go = readFileSync(path.join(packageRoot(), "src/net/netd/protocol.go"), "utf8");
    const declared = [...go.matchAll(/^\s+op\w+\s+= "(\w+)"$/gm)].map((m) => m[1]);
    assert.deepEqual(declared.sort(), [...NETD_OPS].sort());
  });
});
