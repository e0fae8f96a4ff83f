/** Connection settings: per call → client → environment → default, and errors that name where a bad value came from. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Controller, DEFAULT_DAEMON_URL, InvalidArgumentError } from "../../src/sdk/index.js";
import { parseDaemonUrl, resolveSettings } from "../../src/sdk/settings.js";

describe("settings resolution", () => {
  it("defaults to the daemon's Unix socket, no token, 60 s request timeout", () => {
    const s = resolveSettings({ env: {} });
    assert.deepEqual(s.address, {
      kind: "unix",
      socketPath: "/run/forkd/forkd.sock",
      display: DEFAULT_DAEMON_URL,
    });
    assert.equal(s.addressSource, "the default address");
    assert.equal(s.token, undefined);
    assert.equal(s.requestTimeoutMs, 60_000);
  });

  it("reads FORKD_URL and FORKD_TOKEN from the environment (trimmed), ignoring empty values", () => {
    const s = resolveSettings({ env: { FORKD_URL: " http://127.0.0.1:8889 ", FORKD_TOKEN: "abc123\n" } });
    assert.equal(s.address.kind, "tcp");
    assert.equal(s.address.display, "http://127.0.0.1:8889");
    assert.equal(s.addressSource, "FORKD_URL");
    assert.equal(s.token, "abc123");
    assert.equal(s.tokenSource, "FORKD_TOKEN");
    const empty = resolveSettings({ env: { FORKD_URL: "", FORKD_TOKEN: "  " } });
    assert.equal(empty.address.display, DEFAULT_DAEMON_URL);
    assert.equal(empty.token, undefined);
  });

  it("lets the client override the environment and the call override the client", () => {
    const env = { FORKD_URL: "http://10.0.0.1:1", FORKD_TOKEN: "from-env" };
    const client = {
      env,
      url: "unix:/tmp/x.sock",
      token: "from-client",
      requestTimeoutMs: 5_000,
      headers: { "x-a": "1" },
    };
    const s = resolveSettings(client, { token: "from-call", requestTimeoutMs: 0, headers: { "x-b": "2" } });
    assert.equal(s.address.display, "unix:/tmp/x.sock");
    assert.equal(s.addressSource, "the `url` option");
    assert.equal(s.token, "from-call");
    assert.equal(s.tokenSource, "the call's `token` option");
    assert.equal(s.requestTimeoutMs, 0);
    assert.deepEqual(s.headers, { "x-a": "1", "x-b": "2" });
    const clientOnly = resolveSettings(client);
    assert.equal(clientOnly.token, "from-client");
    assert.equal(clientOnly.requestTimeoutMs, 5_000);
  });

  it("reads the environment when a call is made, not when the module loads", () => {
    const env: Record<string, string | undefined> = {};
    const controller = new Controller({ env });
    assert.equal(controller.settings().address.display, DEFAULT_DAEMON_URL);
    env.FORKD_URL = "https://forkd.internal:9443/api/";
    const later = controller.settings().address;
    assert.equal(later.kind, "tcp");
    assert.equal(later.display, "https://forkd.internal:9443/api");
    if (later.kind === "tcp") {
      assert.equal(later.basePath, "/api");
      assert.equal(later.port, 9443);
    }
  });
});

describe("daemon addresses", () => {
  it("parses unix:, unix:// and http(s) forms, IPv6 hosts and default ports", () => {
    assert.deepEqual(parseDaemonUrl("unix:/run/f.sock"), {
      kind: "unix",
      socketPath: "/run/f.sock",
      display: "unix:/run/f.sock",
    });
    assert.deepEqual(parseDaemonUrl("unix:///run/f.sock"), {
      kind: "unix",
      socketPath: "/run/f.sock",
      display: "unix:/run/f.sock",
    });
    const v6 = parseDaemonUrl("http://[::1]:8889");
    assert.ok(v6.kind === "tcp" && v6.hostname === "::1" && v6.port === 8889);
    const https = parseDaemonUrl("https://example.test");
    assert.ok(https.kind === "tcp" && https.port === 443 && https.protocol === "https:");
  });

  for (const [url, fragment] of [
    ["unix:relative.sock", "must be absolute"],
    ["ftp://host:21", "unsupported scheme"],
    ["not a url", "not a daemon address"],
    ["http://user:pw@host:1", "no credentials"],
    ["http://host:1/?x=1", "no credentials, query"],
  ] as const) {
    it(`rejects ${JSON.stringify(url)} naming where it came from`, () => {
      assert.throws(
        () => resolveSettings({ env: { FORKD_URL: url } }),
        (err: unknown) =>
          err instanceof InvalidArgumentError &&
          err.message.includes("FORKD_URL") &&
          err.message.includes(fragment),
      );
    });
  }

  it("fails at construction for a bad client url, naming the option", () => {
    assert.throws(
      () => new Controller({ url: "tcp://x", env: {} }),
      (err: unknown) => err instanceof InvalidArgumentError && err.message.includes("the `url` option"),
    );
  });

  it("rejects tokens and headers that would corrupt the request, and bad durations", () => {
    assert.throws(
      () => resolveSettings({ env: { FORKD_TOKEN: "two words" } }),
      (err: unknown) => err instanceof InvalidArgumentError && err.message.includes("FORKD_TOKEN"),
    );
    assert.throws(
      () => resolveSettings({ env: {}, headers: { "x-a": "1\r\nx-evil: 1" } }),
      InvalidArgumentError,
    );
    assert.throws(() => resolveSettings({ env: {}, headers: { "bad name": "1" } }), InvalidArgumentError);
    for (const bad of [-1, 1.5, Number.NaN, 2 ** 31]) {
      assert.throws(
        () => resolveSettings({ env: {}, requestTimeoutMs: bad }),
        (err: unknown) => err instanceof InvalidArgumentError && err.message.includes("requestTimeoutMs"),
      );
    }
  });
});
