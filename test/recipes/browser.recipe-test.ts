/**
 * The browser recipe (npm run test:recipes: a large Debian build and Chromium's start-up under TCG): headless
 * Chromium launched by `start` in the parent keeps running in every child. Playwright (the real client library)
 * drives each child's browser over CDP through the daemon's port proxy: the same browser process (the parent's
 * pid) in every child, pages and state of its own in each.
 */
import assert from "node:assert/strict";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import pino from "pino";
import { chromium } from "playwright-core";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const TOKEN = "browser-recipe-token-0123456789abcdef";
const DEVTOOLS_PORT = 9222;

describe("recipe browser", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Awaited<ReturnType<typeof openServices>>;
  let daemon: RunningDaemon;
  let api: string;

  before(async () => {
    home = await tempHome("forkd-recipe-browser-");
    await createSnapshot(home, { tag: "browser", template: "browser" });
    services = await openServices(home);
    const tokenFile = path.join(home.home, "tokens");
    await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    daemon = await startDaemon(
      {
        socketPath: null,
        bind: "127.0.0.1:0",
        tokenFile,
        auditLog: null,
        snapshotsDir: home.snapshots,
        logger: pino({ level: "warn" }),
      },
      { ...services, close: async () => {} },
    );
    api = daemon.urls[0] as string;
  });

  after(async () => {
    await daemon?.stop("test over");
    await services?.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  /** The child's DevTools endpoint through the port proxy, as Playwright connects to it. */
  async function devtoolsOf(id: string) {
    const base = `${api.replace(/\/$/, "")}/v1/sandboxes/${id}/ports/${DEVTOOLS_PORT}`;
    const version = await fetch(`${base}/json/version`, { headers: { authorization: `Bearer ${TOKEN}` } });
    assert.equal(version.status, 200, await version.clone().text());
    const info = (await version.json()) as { Browser: string; webSocketDebuggerUrl: string };
    // Chromium names its socket by the Host it was asked on; the path is what identifies the browser.
    const { pathname } = new URL(info.webSocketDebuggerUrl);
    return { browser: info.Browser, ws: `${base.replace(/^http/, "ws")}${pathname}` };
  }

  it("every child has the parent's browser running; Playwright drives each one's own pages", async () => {
    const children = await services.sandboxes.spawn({ snapshotTag: "browser", n: 2, timeoutMs: 0 });
    const ids = children.map((c) => (c as { id: string }).id);
    const pids = new Set<string>();
    for (const [i, id] of ids.entries()) {
      // The browser process itself: the one with the DevTools flag and no --type (renderers and helpers have one).
      const ps = await services.sandboxes.exec(id, [
        "sh",
        "-c",
        'for p in /proc/[0-9]*; do c=$(tr "\\0" " " < $p/cmdline 2>/dev/null); case "$c" in *--type=*) ;; *remote-debugging-port*) basename "$p";; esac; done',
      ]);
      assert.equal(ps.exitCode, 0, ps.stderr.toString());
      const endpoint = await devtoolsOf(id);
      assert.match(endpoint.browser, /^HeadlessChrome\//);
      const started = performance.now();
      const browser = await chromium.connectOverCDP(endpoint.ws, {
        headers: { authorization: `Bearer ${TOKEN}` },
        timeout: 120_000,
      });
      try {
        const context = browser.contexts()[0] ?? (await browser.newContext());
        const page = await context.newPage();
        await page.setContent(`<title>child ${i}</title><p id="n">${i * 21}</p>`);
        assert.equal(await page.title(), `child ${i}`);
        assert.equal(await page.evaluate("Number(document.getElementById('n').textContent) * 2"), i * 42);
        // The pages this child's browser has: about:blank from the parent, plus this test's, never a sibling's.
        const titles = await Promise.all(context.pages().map((p) => p.title()));
        assert.ok(!titles.includes(`child ${1 - i}`), `child ${i} sees only its own pages: ${titles}`);
        const shot = await page.screenshot();
        assert.ok(shot.length > 500 && shot.subarray(1, 4).toString() === "PNG", "a real screenshot");
      } finally {
        await browser.close().catch(() => {});
      }
      console.log(`child ${i}: connected and drove a page in ${Math.round(performance.now() - started)} ms`);
      const pid = ps.stdout.toString().trim();
      assert.match(pid, /^\d+$/, `one browser process in child ${i}: ${JSON.stringify(pid)}`);
      pids.add(pid);
    }
    assert.equal(pids.size, 1, "one browser process, started in the parent, in every child");
    for (const id of ids) await services.sandboxes.kill(id);
  });
});
