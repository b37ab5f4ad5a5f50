"""The root of blobstate's exception tree.

Every error blobstate raises on purpose derives from :class:`BlobstateError` (besides the builtin base
that says what kind of failure it is, such as ``ValueError`` or ``TimeoutError``), so a caller or the
command line can tell blobstate's own, already readable errors from unexpected ones.
"""

from __future__ import annotations


class BlobstateError(Exception):
    """Base class of every error blobstate raises; its message names the thing at fault."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty): for one-line
    reports of errors whose text (Spark's, py4j's) may run to pages."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = ["BlobstateError", "first_line"]
