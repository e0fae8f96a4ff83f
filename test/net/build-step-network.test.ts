/**
 * A networked build step against a real sandbox's ports: a sandbox with a network of its own serves HTTP in
 * its guest (the daemon's port proxy reaches it), and a format-2 build's `run` step with `network = true`
 * tries the sandbox's namespace address and the configured package index (the tests' internet, named by
 * PIP_INDEX_URL): only the index answers. Before build steps had a network of their
 * own, such a step shared the host's namespace as root, which the host's rules let through to every sandbox.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { SandboxInfo } from "../../src/controller/sandbox-service.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { buildImage, parseTemplate } from "../../src/image/index.js";
import { forgetHostPackageIndexes } from "../../src/image/step-sandbox/indexes.js";
import { debugfsCat } from "../image/helpers.js";
import { makeBusyboxLayout } from "../image/oci-fixtures.js";
import { HTTP_ECHO } from "../support/guest-programs.js";
import { qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import { INTERNET_HOSTS, startTestInternet, type TestInternet } from "../support/test-internet.js";

const root = process.getuid?.() === 0;
const GUEST_PORT = 8080;

describe("a networked build step and the sandboxes' ports", {
  timeout: 30 * 60_000,
  skip: !root && "needs root",
}, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let internet: TestInternet;
  let services: Awaited<ReturnType<typeof openServices>>;
  let dir: string;
  const savedIndex = process.env.PIP_INDEX_URL;

  before(async () => {
    home = await tempHome("forkd-build-net-");
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-build-net-"));
    await fs.chmod(dir, 0o711);
    internet = await startTestInternet();
    services = await openServices(home, { network: { network: { dnsUpstreams: [internet.dns] } } });
    process.env.PIP_INDEX_URL = `http://${INTERNET_HOSTS.allowed}/simple`;
    forgetHostPackageIndexes();
  });

  after(async () => {
    if (savedIndex === undefined) delete process.env.PIP_INDEX_URL;
    else process.env.PIP_INDEX_URL = savedIndex;
    forgetHostPackageIndexes();
    await services?.close({ killSandboxes: true });
    await internet?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    if (dir) await fs.rm(dir, { recursive: true, force: true });
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("reaches the configured index and no sandbox's port", async () => {
    const tag = await linkSharedSnapshot(home.home, "pyagent");
    const [spawned] = await services.sandboxes.spawn({
      snapshotTag: tag,
      n: 1,
      timeoutMs: 0,
      network: { default: "allow" },
    });
    const sb = spawned as SandboxInfo;
    assert.equal(sb.network.kind, "netns");
    await services.sandboxes.files.write(sb.id, "/tmp/http_echo.py", Buffer.from(HTTP_ECHO));
    const started = await services.sandboxes.exec(sb.id, [
      "sh",
      "-c",
      `setsid -f python3 /tmp/http_echo.py ${GUEST_PORT} >/dev/null 2>&1 </dev/null`,
    ]);
    assert.equal(started.exitCode, 0, started.stderr.toString());
    // The host (the daemon's proxy) reaches the guest's server: the port is open.
    await waitFor("the guest's server", 60_000, async () => {
      const res = await fetch(`http://${sb.network.address}:${GUEST_PORT}/`).catch(() => undefined);
      return res?.status === 200 ? true : undefined;
    });
    const targets: [string, string, number][] = [
      ["index", INTERNET_HOSTS.allowed, 80],
      ["sandbox-port", sb.network.address as string, GUEST_PORT],
    ];
    const probe = targets
      .map(
        ([name, ip, port]) =>
          `if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${ip} ${port} | grep -q 'HTTP/1'; then echo ${name}=reachable; else echo ${name}=unreachable; fi`,
      )
      .join("; ");
    const t = path.join(dir, "t");
    await fs.mkdir(t, { recursive: true });
    await makeBusyboxLayout(path.join(dir, "img"));
    await fs.cp(path.join(dir, "img", "layout"), path.join(t, "layout"), { recursive: true });
    const text = `format = 2\nname = "netprobe"\nmemory_mib = 256\ndisk_mib = 256\n[from]\noci = "layout"\n[[steps]]\nrun = '''(${probe}) > /net.txt'''\nnetwork = true\n`;
    await fs.writeFile(path.join(t, "template.toml"), text);
    const built = await buildImage(await parseTemplate(text, path.join(t, "template.toml")), {
      cacheDir: path.join(dir, "cache"),
    });
    assert.deepEqual((await debugfsCat(built.rootfs, "/net.txt")).trim().split("\n"), [
      "index=reachable",
      "sandbox-port=unreachable",
    ]);
    await services.sandboxes.kill(sb.id);
  });
});
