"""A small library under test: the project the ci-parallel-pytest recipe's children test, one file each."""

import re
import statistics


def slugify(text: str) -> str:
    """Lowercase words joined by '-', anything else dropped."""
    return "-".join(re.findall(r"[a-z0-9]+", text.lower()))


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap; a word longer than width gets a line of its own."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def summary(values: list[float]) -> dict[str, float]:
    """Mean, median and population standard deviation."""
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "stdev": statistics.pstdev(values),
    }
