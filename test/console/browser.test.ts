/**
 * The web console in a real headless Chromium (Debian's, driven by playwright-core) against a real daemon with
 * real VMs: refused without a token or with a wrong one, log in, see a sandbox spawned through the API appear
 * under its snapshot, branch it from the page and see the new snapshot, run `echo` in a terminal and see the
 * output, kill it from the page. Each state is written as a screenshot to the test output directory
 * (FORKD_TEST_OUTPUT, default test-output/) under console/, for review.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { type BrowserContext, chromium, type Page } from "playwright-core";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";

const CHROMIUM = process.env.FORKD_CHROMIUM ?? "/usr/bin/chromium";
const CHROMIUM_FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
/** Restores, branches and shells under TCG on a loaded 2-core host take seconds each. */
const STEP_TIMEOUT_MS = 120_000;

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const outputDir = path.join(
  process.env.FORKD_TEST_OUTPUT ??
    path.join(repoRoot.endsWith("dist") ? path.dirname(repoRoot) : repoRoot, "test-output"),
  "console",
);

describe("the web console in Chromium, on real VMs", { timeout: 15 * 60_000 }, () => {
  let daemon: TestDaemon;
  let profile: string;
  let context: BrowserContext;
  let page: Page;
  let shot = 0;

  const screenshot = async (name: string) => {
    shot++;
    const file = path.join(outputDir, `${String(shot).padStart(2, "0")}-${name}.png`);
    await page.screenshot({ path: file });
    return file;
  };

  before(async () => {
    // Only this run's screenshots, so the numbering tells the order.
    await rm(outputDir, { recursive: true, force: true });
    await mkdir(outputDir, { recursive: true });
    daemon = await startDaemon();
    profile = await mkdtemp(path.join(os.tmpdir(), "forkd-chromium-"));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_FLAGS,
      viewport: { width: 1400, height: 900 },
    });
    page = context.pages()[0] ?? (await context.newPage());
    page.setDefaultTimeout(STEP_TIMEOUT_MS);
  });

  after(async () => {
    await context?.close();
    if (profile) await rm(profile, { recursive: true, force: true });
    await daemon?.stop();
  });

  it("refuses the page's data without a login, and a wrong token", async () => {
    const response = await page.goto(`${daemon.tcpUrl}/console/`);
    const csp = response?.headers()["content-security-policy"] ?? "";
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /script-src 'self'(;|$)/);
    assert.match(csp, /frame-ancestors 'none'/);
    await page.getByLabel("Daemon token").waitFor();
    // The browser enforces it: an inline script (what an injection would add) does not run.
    const inlineRan = await page.evaluate(`new Promise((resolve) => {
      document.addEventListener("securitypolicyviolation", () => resolve(window.__inline === 1), { once: true });
      const script = document.createElement("script");
      script.textContent = "window.__inline = 1";
      document.head.append(script);
    })`);
    assert.equal(inlineRan, false, "the CSP blocked the inline script");
    await screenshot("login");
    const before = await page.evaluate(async () => {
      const list = await fetch("/v1/sandboxes");
      const events = await fetch("/console/api/events");
      return [list.status, events.status];
    });
    assert.deepEqual(before, [401, 401], "nothing but the page and the login without a session");
    assert.equal(await page.getByRole("button", { name: "Log in" }).isDisabled(), true, "no empty token");
    await page.getByLabel("Daemon token").fill("this-is-not-the-daemon-token");
    await page.getByRole("button", { name: "Log in" }).click();
    const error = page.getByTestId("login-error");
    await error.waitFor();
    assert.match((await error.textContent()) ?? "", /not one of the daemon's tokens/);
    await screenshot("login-refused");
    const cookies = await context.cookies();
    assert.equal(cookies.length, 0, "no cookie for a refused login");
  });

  it("logs in with the token and shows a sandbox spawned through the API under its snapshot", async () => {
    await page.getByLabel("Daemon token").fill(daemon.token);
    await page.getByRole("button", { name: "Log in" }).click();
    await page.locator('[data-testid="feed-status"].live').waitFor();
    const [cookie] = await context.cookies();
    assert.equal(cookie?.httpOnly, true);
    assert.equal(cookie?.sameSite, "Strict");
    assert.equal(await page.evaluate("document.cookie"), "", "the page's scripts cannot read the session");

    // Through the REST API: the SDK has no metadata option.
    const answer = await fetch(`${daemon.tcpUrl}/v1/sandboxes`, {
      method: "POST",
      headers: { authorization: `Bearer ${daemon.token}`, "content-type": "application/json" },
      body: JSON.stringify({
        snapshot_tag: daemon.tag,
        n: 1,
        metadata: { owner: "<img src=x onerror=alert(1)>" },
      }),
    });
    const spawnedBody = await answer.text();
    assert.equal(answer.status, 201, spawnedBody);
    const id = (JSON.parse(spawnedBody) as { id: string }[])[0]?.id as string;
    const row = page.getByTestId(`sandbox-${id}`);
    await row.waitFor();
    // The row sits in the list under its snapshot's row.
    const parentRow = row.locator("xpath=ancestor::li[2]/div[contains(@class,'row')]").first();
    assert.equal(await parentRow.getAttribute("data-testid"), `snapshot-${daemon.tag}`);
    // The feed may have shown it starting; it turns running once the spawn is answered.
    await page.locator(`[data-testid="sandbox-${id}"][data-status="running"]`).waitFor();
    await row.getByRole("button", { name: id }).click();
    const details = page.getByTestId("sandbox-details");
    await details.waitFor();
    await details.getByText("PSS").waitFor();
    // Metadata from the API is text, never markup.
    await details.getByText("<img src=x onerror=alert(1)>").waitFor();
    assert.equal(await page.locator("img[src=x]").count(), 0);
    await screenshot("sandbox-in-tree");
  });

  it("branches the sandbox from the page and shows the new snapshot", async () => {
    const details = page.getByTestId("sandbox-details");
    await details.getByLabel("branch mode").selectOption("diff");
    await details.getByLabel("new snapshot tag").fill("console-branch");
    await details.getByRole("button", { name: "Branch", exact: true }).click();
    await details.getByTestId("branch-result").waitFor();
    assert.match((await details.getByTestId("branch-result").textContent()) ?? "", /console-branch \(diff\)/);
    const snapshotRow = page.getByTestId("snapshot-console-branch");
    // The feed may show it being written first; it turns a diff once it is complete.
    await page.locator('[data-testid="snapshot-console-branch"][data-kind="diff"]').waitFor();
    const sandboxRow = await page.locator("[data-testid^=sandbox-sb-]").first().getAttribute("data-testid");
    const under = snapshotRow.locator("xpath=ancestor::li[2]/div[contains(@class,'row')]").first();
    assert.equal(await under.getAttribute("data-testid"), sandboxRow, "the branch hangs under its sandbox");
    await screenshot("branched");
    // A daemon error is shown where it happened: the tag exists now.
    await details.getByRole("button", { name: "Branch", exact: true }).click();
    const error = details.getByTestId("action-error");
    await error.waitFor();
    assert.match((await error.textContent()) ?? "", /already exists|exists/);
    assert.match((await error.textContent()) ?? "", /409 conflict/);
    await screenshot("branch-error");
  });

  it("opens a terminal, runs echo and shows its output", async () => {
    const details = page.getByTestId("sandbox-details");
    await details.getByRole("button", { name: "Open terminal" }).click();
    const terminal = page.locator("[data-testid^=terminal-sb-]").first();
    await terminal.getByTestId("terminal-status").filter({ hasText: "shell pid" }).waitFor();
    await terminal.locator(".xterm-rows").filter({ hasText: "#" }).waitFor();
    await terminal.locator(".xterm").click();
    await page.keyboard.type("echo console-$((6*7))-ok\n");
    await terminal.locator(".xterm-rows").filter({ hasText: "console-42-ok" }).waitFor();
    await screenshot("terminal-echo");
    // A second terminal at once, then the first closed cleanly.
    await details.getByRole("button", { name: "Open terminal" }).click();
    await page
      .locator("[data-testid^=terminal-sb-]")
      .nth(1)
      .getByTestId("terminal-status")
      .filter({ hasText: "shell pid" })
      .waitFor();
    assert.equal(await page.locator("[data-testid^=terminal-sb-]").count(), 2);
    await screenshot("two-terminals");
    await terminal.getByRole("button", { name: "close terminal" }).click();
    assert.equal(await page.locator("[data-testid^=terminal-sb-]").count(), 1);
  });

  it("lists a sandbox's directory and shows a file's text", async () => {
    const id = (await page.locator("[data-testid^=sandbox-sb-]").first().getAttribute("data-testid"))?.slice(
      8,
    );
    const put = await fetch(`${daemon.tcpUrl}/v1/sandboxes/${id}/files?path=/tmp/console-note.txt`, {
      method: "PUT",
      headers: { authorization: `Bearer ${daemon.token}`, "content-type": "application/octet-stream" },
      body: "written through the API, read in the console\n",
    });
    assert.equal(put.status, 200, await put.text());
    const files = page.getByTestId("files");
    await files.getByLabel("guest path").fill("/tmp");
    await files.getByRole("button", { name: "List" }).click();
    await files.getByRole("button", { name: "console-note.txt" }).click();
    await files
      .getByTestId("file-content")
      .getByText("written through the API, read in the console")
      .waitFor();
    await files.getByLabel("guest path").fill("/no/such/dir");
    await files.getByRole("button", { name: "List" }).click();
    assert.match((await files.getByTestId("files-error").textContent()) ?? "", /404 not_found/);
    await screenshot("files");
  });

  it("cannot be driven by a page from another origin, even a same-site one holding the cookie", async () => {
    const id = (await page.locator("[data-testid^=sandbox-sb-]").first().getAttribute("data-testid"))?.slice(
      8,
    );
    assert.ok(id);
    const before = await daemon.controller.getSandbox(id);
    const daemonPort = new URL(daemon.tcpUrl).port;
    // 127.0.0.1 on another port: same site (SameSite=Strict cookies go with its requests), another origin.
    const attacker = http.createServer((_request, res) => {
      res.writeHead(200, { "content-type": "text/html" });
      res.end(attackerPage(daemonPort, id));
    });
    await new Promise<void>((resolve) => attacker.listen(0, "127.0.0.1", resolve));
    const attackerPort = (attacker.address() as AddressInfo).port;
    const evil = await context.newPage();
    try {
      await evil.goto(`http://127.0.0.1:${attackerPort}/`);
      const results = (await evil
        .waitForFunction("window.results", undefined, { polling: 100 })
        .then((h) => h.jsonValue())) as Record<string, string>;
      assert.equal(results.read, "blocked", "the page cannot read the API");
      assert.equal(results.terminal, "refused", "the page cannot open a terminal");
      await evil.waitForTimeout(1000); // the no-cors POSTs have landed (or been refused)
    } finally {
      await evil.close();
      const closed = new Promise((resolve) => attacker.close(resolve));
      attacker.closeAllConnections(); // the browser's keep-alive connection would hold close() open
      await closed;
    }
    const after = await daemon.controller.getSandbox(id);
    assert.equal(after.status, "running", "still running: the forged kill did nothing");
    assert.equal(
      after.expires_at_unix_ms ?? null,
      before.expires_at_unix_ms ?? null,
      "the forged timeout did nothing",
    );
    const all = await daemon.controller.listSandboxes();
    assert.equal(all.length, 1, "the forged spawn did nothing");
  });

  it("forks two children from the page and shows them under the fork's snapshot", async () => {
    const details = page.getByTestId("sandbox-details");
    const parentId = (await details.locator("h2 .mono").first().textContent()) ?? "";
    await details.getByLabel("children").fill("2");
    await details.getByRole("button", { name: "Fork", exact: true }).click();
    const result = details.getByTestId("fork-result");
    await result.waitFor();
    const children = (await result.locator("li.mono").allTextContents()).map((t) => t.trim());
    assert.equal(children.length, 2, await result.innerHTML());
    const forkTag = ((await result.locator("span.mono").first().textContent()) ?? "").trim();
    for (const child of children) {
      const row = page.getByTestId(`sandbox-${child}`);
      await row.waitFor();
      const under = row.locator("xpath=ancestor::li[2]/div[contains(@class,'row')]").first();
      assert.equal(
        await under.getAttribute("data-testid"),
        `snapshot-${forkTag}`,
        "a child under its snapshot",
      );
    }
    await screenshot("forked");
    for (const child of children) await daemon.controller.killSandbox(child);
    for (const child of children) await page.getByTestId(`sandbox-${child}`).waitFor({ state: "detached" });
    assert.equal(((await details.locator("h2 .mono").first().textContent()) ?? "").trim(), parentId.trim());
  });

  it("kills the sandbox after a confirmation and it leaves the tree", async () => {
    const details = page.getByTestId("sandbox-details");
    const id = (await page.locator("[data-testid^=sandbox-sb-]").first().getAttribute("data-testid"))?.slice(
      8,
    );
    await details.getByRole("button", { name: "Kill…" }).click();
    await details.getByRole("alertdialog", { name: "confirm kill" }).waitFor();
    await screenshot("kill-confirm");
    await details.getByRole("button", { name: "Kill sandbox" }).click();
    await page.getByTestId(`sandbox-${id}`).waitFor({ state: "detached" });
    assert.deepEqual(
      (await daemon.controller.listSandboxes()).filter((s) => s.id === id),
      [],
      "the daemon no longer has it",
    );
    await page.getByRole("button", { name: "Host" }).click();
    await page.getByTestId("host-panel").waitFor();
    await page
      .getByTestId("chart-ready")
      .getByText(/[1-9]\d* observed/)
      .waitFor();
    await screenshot("killed-host-panel");
  });

  it("logs out, after which the session's cookie opens nothing", async () => {
    await page.getByRole("button", { name: "Log out" }).click();
    await page.getByLabel("Daemon token").waitFor();
    const status = await page.evaluate(async () => (await fetch("/v1/sandboxes")).status);
    assert.equal(status, 401);
    await screenshot("logged-out");
  });
});

/**
 * A hostile page: with the victim's cookie jar it tries to read the sandbox list, spawn, set a timeout and kill
 * (simple requests the browser sends without a preflight), and open a terminal WebSocket; it reports what it
 * could observe in window.results.
 */
function attackerPage(daemonPort: string, id: string): string {
  const api = `http://127.0.0.1:${daemonPort}`;
  return `<!doctype html><script>
(async () => {
  const results = {};
  try {
    const list = await fetch(${JSON.stringify(`${api}/v1/sandboxes`)}, { credentials: "include" });
    results.read = "read " + list.status;
  } catch { results.read = "blocked"; }
  const forged = { method: "POST", credentials: "include", mode: "no-cors", headers: { "content-type": "text/plain" } };
  await fetch(${JSON.stringify(`${api}/v1/sandboxes`)}, { ...forged, body: JSON.stringify({ snapshot_tag: "pyagent" }) }).catch(() => {});
  await fetch(${JSON.stringify(`${api}/v1/sandboxes/${id}/timeout`)}, { ...forged, body: JSON.stringify({ timeout_ms: 1000 }) }).catch(() => {});
  await fetch(${JSON.stringify(`${api}/v1/sandboxes/${id}`)}, { method: "DELETE", credentials: "include", mode: "no-cors" }).catch(() => {});
  results.terminal = await new Promise((resolve) => {
    const ws = new WebSocket(${JSON.stringify(`ws://127.0.0.1:${daemonPort}/console/api/terminal?sandbox=${id}`)}, ["forkd-terminal.v1"]);
    ws.onopen = () => resolve("opened");
    ws.onerror = () => resolve("refused");
  });
  window.results = results;
})();
</script>`;
}
