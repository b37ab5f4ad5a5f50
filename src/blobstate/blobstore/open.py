"""Open a blob store by URL: ``file://`` or a plain path, ``memory://``, ``s3://bucket/prefix``."""

from __future__ import annotations

from typing import Any

from blobstate.blobstore.base import BlobStore
from blobstate.errors import BlobstateError


class BackendNotInstalledError(BlobstateError, ImportError):
    """The blob store backend of a URL needs an optional dependency that is not installed."""


def open_blob_store(url: str, **options: Any) -> BlobStore:
    """Open the blob store at ``url``.

    ``file:///abs/dir`` or a plain path: the local-directory store. ``memory://name``: an in-process
    store for tests. ``s3://bucket/prefix``: S3 or an S3-protocol server; ``endpoint_url`` (or the
    ``BLOBSTATE_S3_ENDPOINT`` environment variable) points at a non-AWS server.
    """
    if url.startswith("memory://"):
        from blobstate.blobstore.memory import MemoryBlobStore

        return MemoryBlobStore(url, **options)
    if url.startswith("s3://"):
        try:
            from blobstate.blobstore.s3 import S3BlobStore
        except ModuleNotFoundError as error:
            raise BackendNotInstalledError(
                f"{url.partition('?')[0]} is an S3 checkpoint, which needs {error.name} (not installed):"
                " pip install 'blobstate[s3]'"
            ) from error

        return S3BlobStore(url, **options)
    if url.startswith("file://") or "://" not in url:
        from blobstate.blobstore.local import LocalBlobStore

        return LocalBlobStore(url, **options)
    raise ValueError(f"unsupported blob store URL {url!r}: use file://, a plain path, memory:// or s3://")
