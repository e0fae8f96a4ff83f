from textkit import wrap


def test_wraps_at_width():
    assert wrap("one two three four", 9) == ["one two", "three", "four"]


def test_long_word_gets_its_own_line():
    assert wrap("a supercalifragilistic b", 5) == ["a", "supercalifragilistic", "b"]


def test_empty():
    assert wrap("", 10) == []
