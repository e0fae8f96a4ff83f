import math

from textkit import summary


def test_summary_of_a_sample():
    result = summary([2, 4, 4, 4, 5, 5, 7, 9])
    assert result["mean"] == 5
    assert result["median"] == 4.5
    assert math.isclose(result["stdev"], 2.0)


def test_single_value():
    assert summary([3.5]) == {"mean": 3.5, "median": 3.5, "stdev": 0.0}
