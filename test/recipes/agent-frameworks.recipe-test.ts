/**
 * The agent-frameworks recipe (npm run test:recipes: a Debian build, smolagents and its dependencies from the
 * machine's configured package index, a warm-up under TCG): smolagents is imported in the parent, so children
 * run a CodeAgent at once. The agent loop is smolagents' own (it parses the model's code, runs it in its local
 * executor, calls the warm tools, returns the final answer); the model is a scripted stand-in for an LLM, which
 * cannot run here.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { qemusMentioning, tempHome } from "../support/host.js";

/** A model that answers every step with the same code (a stand-in for an LLM: none can run on this machine). */
const AGENT_RUN = `
import sys
warm = all(m in sys.modules for m in ('smolagents', 'forkd_tools'))
class ScriptedModel(Model):
    def generate(self, messages, stop_sequences=None, **kwargs):
        code = "n = word_count('forked agents share warm state')\\nfinal_answer(n * line_count('a\\\\nb'))"
        return ChatMessage(role=MessageRole.ASSISTANT, content="Thought: count.\\n<code>\\n" + code + "\\n</code>")
agent = CodeAgent(tools=forkd_tools.TOOLS, model=ScriptedModel(), max_steps=2, verbosity_level=0)
answer = agent.run("How many words, times the lines?")
(FORKD_WARM_MARKER, warm, smolagents.__version__, answer, len(agent.memory.steps) > 0)
`;

describe("recipe agent-frameworks", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-agents-");
    await createSnapshot(home, { tag: "agent-frameworks", template: "agent-frameworks" });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("children run a smolagents CodeAgent with the warm framework and tools", async () => {
    const result = await forkChildren(home, { tag: "agent-frameworks", n: 2, eval: AGENT_RUN });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}\n${child.stderr}`);
      assert.equal(child.result, "('warm', True, '1.26.0', 10, True)");
    }
  });
});
