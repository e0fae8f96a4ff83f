/**
 * The browser-agent recipe (npm run test:recipes: a large Debian build and Chromium's start-up under TCG): in
 * every child the browser started in the parent is running, and browser-agent drives it over CDP through a plan
 * of actions (fill and submit a form, follow a link, read a table, take a screenshot), printing one observation
 * per action. Two children run the plan side by side, each in a tab of its own browser copy.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const TAG = "browser-agent";
const PLAN = [
  { goto: "http://127.0.0.1:8088/index.html" },
  { title: true },
  { fill: "#query", text: "springs" },
  { click: "#go" },
  { read: "#result" },
  { click: "#catalogue" },
  { read: "tr.part" },
  { screenshot: "/tmp/catalogue.png" },
];

describe("recipe browser-agent", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-browser-agent-");
    await createSnapshot(home, { tag: TAG, template: TAG });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("children's agents browse with the browser started in the parent", async () => {
    const script = `echo '${JSON.stringify(PLAN)}' | browser-agent - && head -c 4 /tmp/catalogue.png | tail -c 3`;
    const result = await forkChildren(home, { tag: TAG, n: 2, exec: ["sh", "-c", script] });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, `${child.stdout}\n${child.stderr}`);
      const lines = child.stdout.trim().split("\n");
      assert.equal(lines.pop(), "PNG", "a real screenshot");
      const observations = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
      assert.equal(observations.length, PLAN.length, child.stdout);
      assert.equal(observations[1]?.title, "Parts shop");
      assert.deepEqual(observations[4]?.read, ["results for springs"]);
      assert.equal(observations[5]?.url, "http://127.0.0.1:8088/catalogue.html");
      assert.deepEqual(observations[6]?.read, ["gear\t12.50", "spring\t3.20", "bearing\t7.95"]);
    }
  });
});
