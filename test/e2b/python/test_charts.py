"""Chart results through e2b-code-interpreter, sync and async, on a sandbox of the interpreter tests' template
(test/e2b/code-interpreter: matplotlib and E2B's e2b_charts): a figure shown by plt.show() or left open at the
end of its cell is a display result with its PNG and E2B's chart data, as on E2B's code interpreter."""

import base64

import pytest
from conftest import aw

pytestmark = pytest.mark.anyio

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

LINE = """
import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3))
plt.plot([1, 2, 3], [1, 4, 9], label="squares")
plt.title("Squares")
plt.xlabel("n")
plt.ylabel("n squared")
plt.legend()
plt.show()
print("after show")
"""

BAR = """
figure, axes = plt.subplots()
bars = axes.bar(["apples", "pears"], [3, 5], label="fruit")
title = axes.set_title("Fruit")
"""


def only_figure(execution):
    assert execution.error is None, execution.error
    assert [r.is_main_result for r in execution.results] == [False], "one display result, no main result"
    figure = execution.results[0]
    assert base64.b64decode(figure.png).startswith(PNG_MAGIC)
    assert figure.text.startswith("<Figure size"), figure.text
    assert figure.chart is not None, "e2b_charts' data"
    return figure


async def test_plt_show_gives_png_and_line_chart(interpreter):
    seen = []
    execution = await aw(interpreter.run_code(LINE, on_result=seen.append))
    figure = only_figure(execution)
    assert execution.logs.stderr == [], "plt.show() displays the figure: no 'cannot be shown' warning"
    assert execution.logs.stdout == ["after show\n"]
    assert len(seen) == 1 and seen[0].png == figure.png, "on_result gets the figure"
    chart = figure.chart
    assert chart.type.value == "line"
    assert chart.title == "Squares"
    assert (chart.x_label, chart.y_label) == ("n", "n squared")
    assert [element.label for element in chart.elements] == ["squares"]
    assert [tuple(map(float, p)) for p in chart.elements[0].points] == [(1, 1), (2, 4), (3, 9)]
    # plt.show() closed it: the next cell shows nothing.
    assert (await aw(interpreter.run_code("len(plt.get_fignums())"))).text == "0"


async def test_figure_open_at_the_end_of_the_cell_gives_a_bar_chart(interpreter):
    chart = only_figure(await aw(interpreter.run_code(BAR))).chart
    assert chart.type.value == "bar"
    assert chart.title == "Fruit"
    assert [(bar.label, float(bar.value), bar.group) for bar in chart.elements] == [
        ("apples", 3.0, "fruit"),
        ("pears", 5.0, "fruit"),
    ]
