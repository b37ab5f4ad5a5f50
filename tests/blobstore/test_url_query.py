"""Options in a blob store URL's query: one splitter for every backend, secrets kept out of its errors."""

from __future__ import annotations

import pytest

from blobstate.blobstore.url_query import split_url_query


class QueryError(ValueError):
    pass


def split(url: str) -> tuple[str, dict[str, str]]:
    return split_url_query(url, backend="Test", error=QueryError)


def test_the_query_becomes_options() -> None:
    assert split("t://b/p?a=1&b=") == ("t://b/p", {"a": "1", "b": ""})
    assert split("t://b/p") == ("t://b/p", {})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("t://b/p?key=hunter2&a=1#frag", "must not have a fragment"),
        ("t://b/p?key=hunter2&a", "name=value pairs"),
        ("t://b/p?key=hunter2&a=1&a=2", "gives option a twice"),
    ],
)
def test_each_error_names_the_backend_and_url_without_the_secret(url: str, expected: str) -> None:
    with pytest.raises(QueryError, match=expected) as raised:
        split(url)
    assert "Test URL 't://b/p?key=***" in str(raised.value) and "hunter2" not in str(raised.value)
