"""Checks on the fields a blob store reads from a server's answer.

An answer cut short in transit can still parse: a reply cut inside its headers has a status line and no
body, which an SDK turns into an empty result (no tag set, no listed keys, an empty object). Every field
a backend uses is therefore checked here for presence and type before it is believed; a missing or
malformed field raises :class:`MalformedAnswerError`, which is transient (the request is repeated within
the store's attempts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from blobstate.blobstore.base import TransientBlobError

T = TypeVar("T")


class MalformedAnswerError(TransientBlobError):
    """A server's answer lacks a field the request must return, or has one of the wrong type."""


def field(answer: Any, key: str, kind: type[T], what: str) -> T:
    """``answer[key]`` if ``answer`` is a mapping holding a ``kind`` there; else a malformed answer.

    ``what`` names the request in the error (``"tagging of key 'a'"``). ``bool`` is not an ``int`` here.
    """
    if not isinstance(answer, Mapping):
        raise MalformedAnswerError(f"malformed answer to the {what} request: {type(answer).__name__}")
    if key not in answer:
        raise MalformedAnswerError(f"malformed answer to the {what} request: no {key}")
    value = answer[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedAnswerError(
            f"malformed answer to the {what} request: {key} is {type(value).__name__}, not {kind.__name__}"
        )
    return value


def records(
    answer: Any, key: str, fields: Mapping[str, type], what: str, *, optional: bool = False
) -> list[Any]:
    """The list ``answer[key]`` whose items are mappings holding every field of ``fields`` (name: type).

    With ``optional`` a missing ``key`` is an empty list (S3 leaves out ``Contents`` when nothing is listed).
    """
    if optional and isinstance(answer, Mapping) and key not in answer:
        return []
    items = field(answer, key, list, what)
    for item in items:
        if not isinstance(item, Mapping):
            kind_name = type(item).__name__
            raise MalformedAnswerError(f"malformed answer to the {what} request: {key} holds a {kind_name}")
        for name, kind in fields.items():
            field(item, name, kind, what)
    return items


def body_length(expected: Any, received: int, what: str) -> None:
    """Check that a body of ``received`` bytes is the whole of one announced as ``expected`` bytes."""
    if not isinstance(expected, int) or isinstance(expected, bool):
        raise MalformedAnswerError(f"malformed answer to the {what} request: no content length")
    if expected != received:
        raise MalformedAnswerError(
            f"malformed answer to the {what} request: {received} bytes of the {expected} announced"
        )
