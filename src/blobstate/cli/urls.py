"""How the command line's help names the locations a command accepts (every blob store scheme)."""

from __future__ import annotations

URL_FORMS = (
    "a local path or file:// URL, s3://bucket/prefix, az://container/prefix,"
    " abfss://container@account.dfs.core.windows.net/prefix (or abfs://), or memory:// (tests)"
)
"""The forms of a location every command accepts (``blobstate.blobstore.open_blob_store``)."""
