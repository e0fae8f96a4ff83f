/**
 * The web console in a real headless Chromium (Debian's, driven by playwright-core) against a real daemon with
 * real VMs: refused without a token or with a wrong one, log in, see a sandbox spawned through the API appear
 * under its snapshot, branch it from the page and see the new snapshot, run `echo` in a terminal and see the
 * output, kill it from the page. Each state is written as a screenshot to the test output directory
 * (FORKD_TEST_OUTPUT, default test-output/) under console/, for review.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
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
    await page.goto(`${daemon.tcpUrl}/console/`);
    await page.getByLabel("Daemon token").waitFor();
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
    assert.equal(await row.getAttribute("data-status"), "running");
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
    await snapshotRow.waitFor();
    assert.equal(await snapshotRow.getAttribute("data-kind"), "diff");
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
