"""The root of blobstate's exception tree.

Every error blobstate raises on purpose derives from :class:`BlobstateError` (besides the builtin base
that says what kind of failure it is, such as ``ValueError`` or ``TimeoutError``), so a caller or the
command line can tell blobstate's own, already readable errors from unexpected ones.
"""

from __future__ import annotations


class BlobstateError(Exception):
    """Base class of every error blobstate raises; its message names the thing at fault."""


__all__ = ["BlobstateError"]
