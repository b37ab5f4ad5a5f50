"""How the command line's help names the locations a command accepts (every blob store scheme)."""

from __future__ import annotations

from blobstate.blobstore.schemes import url_forms

URL_FORMS = url_forms()
"""The forms of a location every command accepts (``blobstate.blobstore.open_blob_store``)."""
