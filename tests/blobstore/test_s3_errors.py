"""S3 failures that must be named, not mistaken for something else: a missing bucket, no credentials."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import BlobNotFoundError, BlobStore, BucketNotFoundError, open_blob_store


def _operations(tmp_path: Path) -> dict[str, Callable[[BlobStore], Any]]:
    source = tmp_path / "source"
    source.write_bytes(b"file")
    return {
        "exists": lambda s: s.exists("commits/1.json"),
        "delete_if_exists": lambda s: s.delete_if_exists("commits/1.json"),
        "delete": lambda s: s.delete("commits/1.json"),
        "get": lambda s: s.get("commits/1.json"),
        "get_file": lambda s: s.get_file("commits/1.json", tmp_path / "target"),
        "put": lambda s: s.put("a", b"1", ttl=60),
        "put file": lambda s: s.put("a", source),
        "put_if_absent": lambda s: s.put_if_absent("commits/1.json", b"1"),
        "has_ttl": lambda s: s.has_ttl("a"),
        "remove_ttl": lambda s: s.remove_ttl("a"),
        "list": lambda s: s.list(),
        "list prefix": lambda s: s.list("commits/"),
        "list_sizes": lambda s: s.list_sizes(),
        "expiry_problem": lambda s: s.expiry_problem(),
        "install_expiry_rule": lambda s: s.install_expiry_rule(),
    }


OPERATIONS = [
    "exists",
    "delete_if_exists",
    "delete",
    "get",
    "get_file",
    "put",
    "put file",
    "put_if_absent",
    "has_ttl",
    "remove_ttl",
    "list",
    "list prefix",
    "list_sizes",
    "expiry_problem",
    "install_expiry_rule",
]


@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_on_a_missing_bucket_names_the_bucket(
    s3_endpoint: str, operation: str, tmp_path: Path
) -> None:
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    call = _operations(tmp_path)[operation]
    with open_blob_store(f"s3://{bucket}/root") as store:
        calls = _count_requests(store)
        with pytest.raises(BucketNotFoundError) as info:
            call(store)
    assert not isinstance(info.value, BlobNotFoundError)  # a missing bucket is not a missing object
    message = str(info.value)
    assert f"bucket {bucket!r} does not exist at {s3_endpoint}" in message
    assert "create the bucket" in message
    assert (
        1 <= calls["n"] <= 2
    )  # not retried (a HEAD's 404 takes one more request to tell the bucket is gone)


def _count_requests(store: Any) -> dict[str, int]:
    calls = {"n": 0}

    def count(**_: Any) -> None:
        calls["n"] += 1

    store._client.meta.events.register("before-send.s3", count)
    return calls


def test_a_missing_object_in_an_existing_bucket_is_still_just_missing(s3_url: str) -> None:
    with open_blob_store(s3_url) as store:
        assert store.exists("commits/1.json") is False
        assert store.delete_if_exists("commits/1.json") is False
        with pytest.raises(BlobNotFoundError):
            store.delete("commits/1.json")


def test_missing_credentials_name_the_url_and_say_how_to_provide_them(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    )
    script = (
        "from blobstate.blobstore import open_blob_store, BlobStoreError\n"
        "store = open_blob_store('s3://bucket/root', endpoint_url='http://127.0.0.1:1')\n"
        "try:\n"
        "    store.get('state/x')\n"
        "except BlobStoreError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    out = result.stdout
    assert out.startswith("BlobStoreError no usable AWS credentials for s3://bucket/root"), (
        out + result.stderr
    )
    assert "AWS_ACCESS_KEY_ID" in out and "AWS_PROFILE" in out
