"""Open a blob store by URL: ``file://`` or a plain path, ``memory://``, ``s3://bucket/prefix``,
``az://container/prefix`` or ``abfs[s]://container@account.dfs.core.windows.net/prefix``."""

from __future__ import annotations

from typing import Any

from blobstate.blobstore.base import BlobStore
from blobstate.errors import ConfigurationError

AZURE_SCHEMES = ("az://", "abfs://", "abfss://")


class BackendNotInstalledError(ConfigurationError, ImportError):
    """The blob store backend of a URL needs an optional dependency that is not installed."""


def open_blob_store(url: str, **options: Any) -> BlobStore:
    """Open the blob store at ``url``.

    ``file:///abs/dir`` or a plain path: the local-directory store. ``memory://name``: an in-process
    store for tests. ``s3://bucket/prefix``: S3 or an S3-protocol server; ``endpoint_url`` (or the
    ``BLOBSTATE_S3_ENDPOINT`` environment variable) points at a non-AWS server. ``az://`` and
    ``abfs[s]://``: Azure Blob Storage (see :mod:`blobstate.blobstore.azure` for credentials and options).
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
    if url.startswith(AZURE_SCHEMES):
        try:
            from blobstate.blobstore.azure import AzureBlobStore
        except ModuleNotFoundError as error:
            raise BackendNotInstalledError(
                f"{url} is an Azure checkpoint, which needs {error.name} (not installed):"
                " pip install 'blobstate[azure]'"
            ) from error

        return AzureBlobStore(url, **options)
    if url.startswith("file://") or "://" not in url:
        from blobstate.blobstore.local import LocalBlobStore

        return LocalBlobStore(url, **options)
    raise ValueError(
        f"unsupported blob store URL {url!r}: use file://, a plain path, memory://, s3:// or az://"
    )
