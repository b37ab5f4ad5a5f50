"""Blob stores: one interface (:class:`BlobStore`), backends opened by URL with :func:`open_blob_store`."""

from __future__ import annotations

from blobstate.blobstore.base import (
    DEFAULT_PENDING_TTL_SECONDS,
    BlobNotFoundError,
    BlobStore,
    BucketNotFoundError,
    InvalidBlobNameError,
    LocationNotADirectoryError,
    LocationNotFoundError,
    TransientBlobError,
)
from blobstate.blobstore.open import open_blob_store, open_existing_blob_store
from blobstate.errors import BlobStoreError

__all__ = [
    "DEFAULT_PENDING_TTL_SECONDS",
    "BlobNotFoundError",
    "BlobStore",
    "BlobStoreError",
    "BucketNotFoundError",
    "InvalidBlobNameError",
    "LocationNotADirectoryError",
    "LocationNotFoundError",
    "TransientBlobError",
    "open_blob_store",
    "open_existing_blob_store",
]
