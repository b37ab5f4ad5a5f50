"""Open a blob store by URL: ``file://`` or a plain path, ``memory://``, ``s3://bucket/prefix`` (or
``s3a://``), ``az://container/prefix`` or ``abfs[s]://container@account.dfs.core.windows.net/prefix``;
:mod:`blobstate.blobstore.schemes` maps each scheme to its backend."""

from __future__ import annotations

from typing import Any

from blobstate.blobstore.base import BlobStore, LocationNotFoundError
from blobstate.blobstore.redact import scrub_chain
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
    try:
        return scheme_of(url).open(url, **options)
    except Exception as error:
        raise scrub_chain(error)  # noqa: B904 (the error raised as it was, its chain made safe)


def open_existing_blob_store(url: str, **options: Any) -> BlobStore:
    """Open the blob store at ``url`` for a command that reads what is there (a checkpoint or a backup
    repository): as :func:`open_blob_store`, then a location that does not exist (a local directory that
    is not there, most often a mistyped path) is refused with :class:`LocationNotFoundError`
    (``<url> does not exist``) instead of being read as an empty store. Object stores have no
    directories: an empty prefix opens, and the command says it holds no checkpoint."""
    store = open_blob_store(url, **options)
    problem = store.location_missing()
    if problem is not None:
        store.close()
        raise LocationNotFoundError(problem)
    return store


def nothing_stored(store: BlobStore) -> str:
    """``": nothing is stored under it (a mistyped path?)"`` when no object at all is under ``store``'s
    location, else ``""``: what a message about a missing ``metadata.json`` adds, since an object
    store's prefix, unlike a directory, cannot be told missing otherwise. Best effort: a failing listing
    adds nothing, the message it completes says what matters."""
    try:
        empty = store.holds_nothing()
    except Exception:  # the caller's message stands without this detail
        return ""
    return ": nothing is stored under it (a mistyped path?)" if empty else ""


__all__ = ["BackendNotInstalledError", "nothing_stored", "open_blob_store", "open_existing_blob_store"]
