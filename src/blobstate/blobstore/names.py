"""Validation of object names used as paths, so nothing outside a store's root can be touched."""

from __future__ import annotations

RESERVED_PREFIX = ".blobstate"
"""Top-level names starting with this are the store's own bookkeeping (for example local TTL records)."""


def _invalid(name: str, why: str) -> Exception:
    from blobstate.blobstore.base import InvalidBlobNameError

    return InvalidBlobNameError(f"invalid blob name {name!r}: {why}")


def validate_blob_name(name: str) -> str:
    """Return ``name`` if it is a safe relative object name, else raise ``InvalidBlobNameError``.

    A safe name is non-empty, relative, slash-separated, and has no empty, ``.`` or ``..`` segment, no
    backslash and no NUL; its first segment does not start with the reserved ``.blobstate`` prefix.
    """
    if not isinstance(name, str):
        raise _invalid(repr(name), "not a string")
    if not name:
        raise _invalid(name, "empty")
    if "\x00" in name:
        raise _invalid(name, "contains NUL")
    if "\\" in name:
        raise _invalid(name, "contains a backslash")
    if name.startswith("/"):
        raise _invalid(name, "absolute")
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            raise _invalid(name, f"bad path segment {segment!r}")
    if name.split("/", 1)[0].startswith(RESERVED_PREFIX):
        raise _invalid(name, f"names starting with {RESERVED_PREFIX!r} are reserved")
    return name


def validate_prefix(prefix: str) -> str:
    """Validate a listing prefix: empty, or a safe name optionally ending with ``/``."""
    if prefix == "":
        return prefix
    validate_blob_name(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def join(*parts: str) -> str:
    """Join name segments with ``/`` and validate the result."""
    return validate_blob_name("/".join(p.strip("/") for p in parts if p))
