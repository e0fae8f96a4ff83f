"""Frameworks that drive E2B themselves, unmodified, against forkd: each makes its own sandbox through the SDK
(configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY), with a scripted model in place of a network
one, so the loop is the framework's own and every step of it is known."""

import re
import subprocess
import sys
from pathlib import Path

from conftest import RUN, SUITE

REPO = Path(__file__).resolve().parents[3]


class Scripted:
    """Replies in order, recording what the framework showed the model each time."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.prompts = []

    def next(self, shown):
        self.prompts.append(shown)
        assert self.replies, f"the framework asked for more steps than scripted; it last showed:\n{shown[-2000:]}"
        return self.replies.pop(0)


def test_smolagents_code_agent_runs_its_tool_loop_in_an_e2b_sandbox():
    from smolagents import CodeAgent, Model, tool
    from smolagents.models import ChatMessage, MessageRole

    @tool
    def word_count(text: str) -> int:
        """Counts the words of a text.

        Args:
            text: the text to count the words of.
        """
        return len(text.split())

    script = Scripted(
        [
            # Step 1: call the tool (defined in the sandbox by the executor) and look at where it ran.
            "Thought: count the words first.\n<code>\nn = word_count('forkd runs E2B code')\n"
            "print('count', n)\nprint('host', open('/proc/sys/kernel/hostname').read().strip())\n</code>",
            # Step 2: an error the agent must see and recover from.
            "Thought: try a division.\n<code>\nratio = n / 0\n</code>",
            # Step 3: state carried between steps (n lives in the sandbox's interpreter); the final answer.
            "Thought: answer.\n<code>\nfinal_answer(n * 10 + 2)\n</code>",
        ]
    )

    class ScriptedModel(Model):
        def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kw):
            shown = "\n".join(str(m.content if hasattr(m, "content") else m.get("content")) for m in messages)
            return ChatMessage(role=MessageRole.ASSISTANT, content=script.next(shown))

    agent = CodeAgent(
        tools=[word_count],
        model=ScriptedModel(model_id="scripted"),
        executor_type="e2b",
        executor_kwargs={"metadata": {"suite": SUITE, "run": RUN, "framework": "smolagents"}, "timeout": 600},
        max_steps=5,
    )
    try:
        answer = agent.run("How many words, times ten, plus two?")
    finally:
        agent.cleanup()
    assert answer == 42
    assert script.replies == [], "every scripted step ran"
    assert "count 4" in script.prompts[1], "the tool ran in the sandbox and its output came back"
    # The model is shown the observation inside its message content (a list of parts, here as its repr).
    assert re.search(r"host sb-[0-9a-f]{12}", script.prompts[1]), "the code ran in a forkd sandbox"
    assert "ZeroDivisionError" in script.prompts[2], "the sandbox's error reached the agent"


def test_examples_agent_py_runs_unchanged():
    """examples/e2b/agent.py, configured by the three variables only (the environment pytest runs in)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "e2b" / "agent.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "samples: [0.0, 0.25, 0.5, 0.75, 1.0]" in lines, done.stdout
    forks = [line for line in lines if line.startswith("fork ")]
    assert len(forks) == 2, done.stdout
    for i, report in enumerate(forks):
        assert report.startswith(f"fork {i}: "), report
        assert f"'parent', 'fork {i}'" in report and "written before the fork | sb-" in report, report
    assert len({report.rsplit("| ", 1)[-1] for report in forks}) == 2, "each fork is its own sandbox"
    assert "parent still has: ['parent']" in lines, done.stdout
