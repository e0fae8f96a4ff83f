"""Tools the agent-frameworks recipe's agents get: plain functions made smolagents tools (their docstrings are
what the model reads). Imported in the warm-up, so every child has them loaded."""

from smolagents import tool


@tool
def word_count(text: str) -> int:
    """Counts the words of a text.

    Args:
        text: the text whose words are counted
    """
    return len(text.split())


@tool
def line_count(text: str) -> int:
    """Counts the lines of a text.

    Args:
        text: the text whose lines are counted
    """
    return len(text.splitlines())


TOOLS = [word_count, line_count]
