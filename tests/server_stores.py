"""Stores on the test S3 and Azure servers reached through a cutting :class:`~faultproxy.FaultProxy`, for
the randomized crash models: URLs, retry options, a fresh bucket or container per history (dropped after
it), and the servers' missing lifecycle expiry.

Neither moto nor azurite runs lifecycle rules, which on S3 and Azure delete pending (tagged) objects once
their TTL has passed. A crash model runs ``gc`` as if every TTL had long passed, so
:func:`emulate_lifecycle` makes the store's ``expire`` do what the rule would have done by then.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blobstate.blobstore import BlobNotFoundError, BlobStore
from faultproxy import FaultProxy

AZURITE_ACCOUNT = "devstoreaccount1"

CUT_RETRY_OPTIONS = "max_attempts=8&backoff_seconds=0.001&connect_timeout=5&read_timeout=10"
"""Options for stores behind a cutting proxy: attempts enough for random cuts, no long sleeps."""


def s3_url_through(proxy: FaultProxy, bucket: str, prefix: str) -> str:
    """``s3://bucket/prefix`` reached through ``proxy``."""
    return f"s3://{bucket}/{prefix}?endpoint_url=http://127.0.0.1:{proxy.port}&{CUT_RETRY_OPTIONS}"


def azure_url_through(proxy: FaultProxy, container: str, prefix: str) -> str:
    """``az://container/prefix`` on azurite reached through ``proxy``."""
    endpoint = f"http://127.0.0.1:{proxy.port}/{AZURITE_ACCOUNT}"
    return f"az://{container}/{prefix}?endpoint_url={endpoint}&{CUT_RETRY_OPTIONS}"


_ADMIN_CLIENTS: dict[str, Any] = {}


def _s3_admin(s3_endpoint: str) -> Any:
    """A boto3 client straight to the test S3 server (never through a proxy), made once per endpoint."""
    import boto3

    client = _ADMIN_CLIENTS.get(s3_endpoint)
    if client is None:
        client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
        _ADMIN_CLIENTS[s3_endpoint] = client
    return client


def new_bucket(s3_endpoint: str) -> str:
    """A fresh bucket on the test S3 server."""
    bucket = f"crash-{uuid.uuid4().hex[:12]}"
    _s3_admin(s3_endpoint).create_bucket(Bucket=bucket)
    return bucket


def new_container() -> str:
    """A fresh container on the test azurite server (reached by AZURE_STORAGE_CONNECTION_STRING)."""
    from azure.storage.blob import BlobServiceClient

    container = f"crash-{uuid.uuid4().hex[:12]}"
    with BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]) as service:
        service.create_container(container)
    return container


def drop_place(store: BlobStore) -> None:
    """Delete the bucket or container of ``store`` (an S3 or Azure store on a test server) with all its
    objects, straight on the server. A history's objects left in place would slow every later history:
    moto scans all of a bucket's keys for each listing."""
    from blobstate.blobstore.azure import AzureBlobStore
    from blobstate.blobstore.s3 import S3BlobStore

    if isinstance(store, S3BlobStore):
        admin = _s3_admin(os.environ["BLOBSTATE_S3_ENDPOINT"])
        for page in admin.get_paginator("list_objects_v2").paginate(Bucket=store.bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                admin.delete_objects(Bucket=store.bucket, Delete={"Objects": keys, "Quiet": True})
        admin.delete_bucket(Bucket=store.bucket)
    elif isinstance(store, AzureBlobStore):
        from azure.storage.blob import BlobServiceClient

        connection = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        with BlobServiceClient.from_connection_string(connection) as service:
            service.delete_container(store.container)


def emulate_lifecycle(store: BlobStore) -> BlobStore:
    """Make ``store.expire(now)`` delete every pending object, as the lifecycle rule does once TTLs pass.

    Only for ``now`` far in the future (the crash models' gc): the rule's TTL is days long.
    """

    def expire(self: BlobStore, now: float | None = None) -> list[str]:
        if now is None or now < 2**39:
            return []
        gone = []
        for name in self.list():
            try:
                if self.has_ttl(name) and self.delete_if_exists(name):
                    gone.append(name)
            except BlobNotFoundError:
                continue
        return gone

    store.expire = types.MethodType(expire, store)  # type: ignore[method-assign]
    return store


@contextlib.contextmanager
def cutting_answers(
    proxy: FaultProxy, counts: Any, inner: BlobStore, seed: int, chance: float, root: Path
) -> Iterator[None]:
    """Cut the proxy's answers at random (seeded) for one history; afterwards close the store, drop its
    bucket or container, remove ``root`` and add the history's answers, cuts, retries and seconds to
    ``counts``."""
    before = (proxy.counts.responses, proxy.counts.cuts, proxy.counts.cuts_in_headers)
    started = time.monotonic()
    proxy.rng.seed(seed)
    proxy.cut_randomly(chance)
    try:
        yield
    finally:
        proxy.disarm()
        counts.retries += inner.retries
        inner.close()
        drop_place(inner)
        shutil.rmtree(root, ignore_errors=True)
        counts.seconds += time.monotonic() - started
        counts.answers += proxy.counts.responses - before[0]
        counts.cuts += proxy.counts.cuts - before[1]
        counts.cuts_in_headers += proxy.counts.cuts_in_headers - before[2]
