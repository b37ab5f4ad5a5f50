"""Phrases the commands share, so that every command words the same thing alike."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``1 delta``, ``2 deltas``, ``0 deltas``: a count with its noun in the right number."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def restore_phrase(base: str | None, deltas: int) -> str:
    """How a version is rebuilt: ``4_ab.snapshot + 2 deltas``, ``4_ab.snapshot`` (no delta to replay),
    ``1 delta from empty`` (no base: replayed onto the empty state), or ``empty`` (version 0)."""
    if base is None:
        return f"{plural(deltas, 'delta')} from empty" if deltas else "empty"
    return f"{base} + {plural(deltas, 'delta')}" if deltas else base
