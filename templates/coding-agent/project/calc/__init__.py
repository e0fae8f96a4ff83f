"""A tiny package for the coding-agent recipe: agents clone, test and lint code like this in a child."""


def add(a, b):
    return a + b


def mean(values):
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)
