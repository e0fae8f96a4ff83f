/**
 * What a networked build step is told about the machine's package indexes: the host's pip/npm configuration as
 * variables, the host's apt sources rewritten for the image's release, the CA bundle. Parsers against the tools'
 * own output formats, and the real host configuration read by the real tools.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import {
  hostPackageConfig,
  npmVariables,
  parseOsRelease,
  pipVariables,
  rewriteSources,
  stepPackageEnvironment,
} from "../../src/image/package-config.js";

describe("package configuration of networked build steps", () => {
  let dir: string;
  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-package-config-"));
  });
  after(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  test("pip config list: index options pass, host paths do not", () => {
    const { env, cert } = pipVariables(
      [
        "global.index-url='https://pypi.mirror.test/simple'",
        "global.extra-index-url='https://a.test/simple https://b.test/simple'",
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        ":env:.find-links='/opt/wheels'",
        ":env:.default-timeout='180'",
        "site.trusted-host='a.test'",
      ].join("\n"),
    );
    assert.deepEqual(env, {
      PIP_INDEX_URL: "https://pypi.mirror.test/simple",
      PIP_EXTRA_INDEX_URL: "https://a.test/simple https://b.test/simple",
      PIP_DEFAULT_TIMEOUT: "180",
      PIP_TRUSTED_HOST: "a.test",
    });
    assert.equal(cert, "/etc/ssl/certs/ca-certificates.crt");
  });

  test("npm config get: set values pass, unset ones (null) do not", () => {
    const { env, cafile } = npmVariables(
      "registry=https://npm.mirror.test/\nproxy=null\nhttps-proxy=http://proxy.test:3128\nstrict-ssl=true\ncafile=/etc/ca.pem\n",
    );
    assert.deepEqual(env, {
      NPM_CONFIG_REGISTRY: "https://npm.mirror.test/",
      NPM_CONFIG_HTTPS_PROXY: "http://proxy.test:3128",
      NPM_CONFIG_STRICT_SSL: "true",
    });
    assert.equal(cafile, "/etc/ca.pem");
  });

  test("apt sources: suites follow the image's release, keyrings move into the step's inputs", () => {
    const deb822 = rewriteSources(
      "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
      "bookworm",
      "trixie",
      "/run/forkd-build/packages/apt/keyrings",
    );
    assert.match(deb822.text, /^Suites: trixie trixie-updates$/m);
    assert.match(
      deb822.text,
      /^Signed-By: \/run\/forkd-build\/packages\/apt\/keyrings\/debian-archive-keyring\.gpg$/m,
    );
    assert.deepEqual(deb822.keyrings, ["/usr/share/keyrings/debian-archive-keyring.gpg"]);
    const oneLine = rewriteSources(
      "deb [arch=amd64 signed-by=/etc/apt/k.gpg] http://mirror.test/debian-security bookworm-security main\n# deb http://x bookworm main\n",
      "bookworm",
      "bookworm",
      "/k",
    );
    assert.equal(
      oneLine.text,
      "deb [arch=amd64 signed-by=/k/k.gpg] http://mirror.test/debian-security bookworm-security main\n# deb http://x bookworm main\n",
    );
  });

  test("a step in an image of the host's distribution gets the host's apt sources; another keeps its own", async () => {
    const config = {
      pip: { PIP_INDEX_URL: "https://pypi.mirror.test/simple" },
      npm: { NPM_CONFIG_REGISTRY: "https://npm.mirror.test/" },
      caBundle: undefined,
      apt: { sources: [path.join(dir, "host.sources")], id: "debian", codename: "bookworm", proxies: {} },
      proxies: {},
    };
    await fs.writeFile(
      config.apt.sources[0] as string,
      "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm\nComponents: main\n",
    );
    const debian = path.join(dir, "debian-root");
    await fs.mkdir(path.join(debian, "etc"), { recursive: true });
    await fs.writeFile(path.join(debian, "etc", "os-release"), 'ID=debian\nVERSION_CODENAME="trixie"\n');
    const step = await stepPackageEnvironment(
      debian,
      path.join(dir, "step-1"),
      "/run/forkd-build/packages",
      config,
    );
    assert.equal(step.env.PIP_INDEX_URL, "https://pypi.mirror.test/simple");
    assert.equal(step.env.NPM_CONFIG_REGISTRY, "https://npm.mirror.test/");
    assert.equal(step.env.APT_CONFIG, "/run/forkd-build/packages/apt/apt.conf");
    const aptConf = await fs.readFile(path.join(dir, "step-1", "apt", "apt.conf"), "utf8");
    assert.match(aptConf, /Dir::Etc::sourceparts "\/run\/forkd-build\/packages\/apt\/sources.list.d";/);
    const [sources] = await fs.readdir(path.join(dir, "step-1", "apt", "sources.list.d"));
    assert.match(
      await fs.readFile(path.join(dir, "step-1", "apt", "sources.list.d", sources as string), "utf8"),
      /^Suites: trixie$/m,
    );
    const alpine = path.join(dir, "alpine-root");
    await fs.mkdir(path.join(alpine, "etc"), { recursive: true });
    await fs.writeFile(path.join(alpine, "etc", "os-release"), "ID=alpine\n");
    const other = await stepPackageEnvironment(alpine, path.join(dir, "step-2"), "/in", config);
    assert.equal(other.env.APT_CONFIG, undefined);
    assert.equal(other.env.PIP_INDEX_URL, "https://pypi.mirror.test/simple");
  });

  test("this machine's configuration, read by its own tools", async () => {
    const config = await hostPackageConfig();
    const release = parseOsRelease(await fs.readFile("/etc/os-release", "utf8"));
    assert.equal(config.apt?.id, release.ID, "the host's apt sources and distribution");
    assert.ok((config.apt?.sources.length ?? 0) > 0);
    // npm reports its effective registry whether or not one is configured.
    assert.match(config.npm.NPM_CONFIG_REGISTRY ?? "", /^https?:\/\//);
    if (config.caBundle) assert.ok((await fs.stat(config.caBundle)).isFile());
  });
});
