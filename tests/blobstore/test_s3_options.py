"""S3 store options: keywords, URL query parameters, their checks, and the URL that carries them."""

from __future__ import annotations

from typing import Any

import pytest

from blobstate.blobstore import BlobStoreError, open_blob_store
from blobstate.blobstore.s3 import S3BlobStore, parse_s3_url
from blobstate.blobstore.s3_options import S3OptionError, S3Settings, s3_url_with_options, split_s3_url

DEAD = "http://127.0.0.1:1"


def test_url_options_and_keywords_reach_the_client() -> None:
    url = "s3://bucket/root?connect_timeout=2.5&read_timeout=30&max_attempts=6&io_threads=3&list_page_size=7"
    with open_blob_store(url, endpoint_url=DEAD, backoff_seconds=0.5) as store:
        assert isinstance(store, S3BlobStore)
        config = store._client.meta.config
        assert (config.connect_timeout, config.read_timeout) == (2.5, 30.0)
        assert (store.max_attempts, store.backoff_seconds, store.io_threads) == (6, 0.5, 3)
        assert store.list_page_size == 7
        assert (store.url, store.bucket, store.prefix) == ("s3://bucket/root", "bucket", "root/")


def test_defaults_and_their_worst_case() -> None:
    settings = S3Settings()
    assert (settings.connect_timeout, settings.read_timeout, settings.max_attempts) == (5.0, 10.0, 4)
    assert settings.backoff_total_seconds == pytest.approx(2.1)
    assert settings.worst_case_seconds == pytest.approx(62.1)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (
            "s3://b/p?read_timeot=5&colour=red",
            r"unknown S3 option\(s\) in the query of .*: colour, read_timeot",
        ),
        ("s3://b/p?read_timeout=soon", r"read_timeout .*expected a number of seconds, got 'soon'"),
        ("s3://b/p?read_timeout=0", "read_timeout .*at least"),
        ("s3://b/p?connect_timeout=inf", "connect_timeout .*finite"),
        ("s3://b/p?max_attempts=0", "max_attempts .*between 1 and 100"),
        ("s3://b/p?max_attempts=2.5", "max_attempts .*integer"),
        ("s3://b/p?list_page_size=5000", "list_page_size .*between 1 and 1000"),
        ("s3://b/p?multipart_chunksize=1024", "multipart_chunksize .*at least 5242880"),
        ("s3://b/p?endpoint_url=ftp://host", "endpoint_url .*http:// or https://"),
        ("s3://b/p?read_timeout=1&read_timeout=2", "gives option read_timeout twice"),
        ("s3://b/p?read_timeout", "name=value pairs"),
        ("s3://b/p?read_timeout=1#frag", "fragment"),
    ],
)
def test_bad_url_options_are_named(url: str, named: str) -> None:
    with pytest.raises(S3OptionError, match=named) as info:
        open_blob_store(url, endpoint_url=DEAD)
    assert isinstance(info.value, BlobStoreError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"read_timout": 1}, r"unknown S3 option\(s\) in the options: read_timout"),
        ({"read_timeout": "1"}, None),  # text is converted, as from a URL or Spark conf
        ({"read_timeout": True}, "read_timeout .*got True"),
        ({"max_attempts": 1.5}, "max_attempts .*integer"),
        ({"region": ""}, "region .*non-empty"),
    ],
)
def test_keyword_options_are_checked(options: dict[str, Any], named: str | None) -> None:
    if named is None:
        open_blob_store("s3://b/p", endpoint_url=DEAD, **options).close()
        return
    with pytest.raises(S3OptionError, match=named):
        open_blob_store("s3://b/p", endpoint_url=DEAD, **options)


def test_an_option_in_the_url_and_as_a_keyword_must_agree() -> None:
    with pytest.raises(S3OptionError, match=r"read_timeout is 5\.0 in the URL .* but 6\.0 as an option"):
        open_blob_store("s3://b/p?read_timeout=5", endpoint_url=DEAD, read_timeout=6)
    open_blob_store("s3://b/p?read_timeout=5", endpoint_url=DEAD, read_timeout=5.0).close()


def test_a_url_carries_options_and_opens_with_them() -> None:
    url = s3_url_with_options("s3://b/p?max_attempts=2", {"read_timeout": 7.5, "endpoint_url": DEAD + "/x?y"})
    location, options = split_s3_url(url)
    assert location == "s3://b/p"
    assert options == {"max_attempts": "2", "read_timeout": "7.5", "endpoint_url": DEAD + "/x?y"}
    assert s3_url_with_options("s3://b/p", {}) == "s3://b/p"
    assert parse_s3_url(url) == ("b", "p/")
    with open_blob_store(
        s3_url_with_options("s3://b/p", {"read_timeout": 7.5, "endpoint_url": DEAD})
    ) as store:
        assert isinstance(store, S3BlobStore)
        assert store._client.meta.config.read_timeout == 7.5
        assert store.max_attempts == S3Settings().max_attempts
        assert store.endpoint == DEAD
