"""Open a blob store by URL: ``file://`` or a plain path, ``memory://``, ``s3://bucket/prefix`` (or
``s3a://``), ``az://container/prefix`` or ``abfs[s]://container@account.dfs.core.windows.net/prefix``;
:mod:`blobstate.blobstore.schemes` maps each scheme to its backend."""

from __future__ import annotations

from typing import Any

from blobstate.blobstore.base import BlobStore
from blobstate.blobstore.schemes import BackendNotInstalledError, scheme_of


def open_blob_store(url: str, **options: Any) -> BlobStore:
    """Open the blob store at ``url``.

    ``file:///abs/dir`` or a plain path: the local-directory store. ``memory://name``: an in-process
    store for tests. ``s3://bucket/prefix`` (``s3a://`` is the same): S3 or an S3-protocol server;
    ``endpoint_url`` (or the ``BLOBSTATE_S3_ENDPOINT`` environment variable) points at a non-AWS server.
    ``az://`` and ``abfs[s]://``: Azure Blob Storage (see :mod:`blobstate.blobstore.azure` for credentials
    and options). An optional backend that is not installed raises :class:`BackendNotInstalledError`
    naming the extra to install.
    """
    return scheme_of(url).open(url, **options)


__all__ = ["BackendNotInstalledError", "open_blob_store"]
