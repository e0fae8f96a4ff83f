import pytest
from textkit import slugify


@pytest.mark.parametrize(
    ("text", "slug"),
    [("Hello, World!", "hello-world"), ("  forkd  v0.5 ", "forkd-v0-5"), ("", ""), ("ÄÖ ok", "ok")],
)
def test_slugify(text, slug):
    assert slugify(text) == slug
