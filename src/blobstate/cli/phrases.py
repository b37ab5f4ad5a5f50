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


def batch_label(batch_id: int, *, rescale: bool = False) -> str:
    """A version by the batch its commit records (``batch_id``: after a rescale no longer ``version - 1``):
    ``batch 5``, or ``rescale of batch 4`` for a rescale commit, which holds batch 4's state repartitioned
    and repeats its batch id."""
    return f"rescale of batch {batch_id}" if rescale else f"batch {batch_id}"


def state_phrase(batch_id: int, *, rescale: bool = False) -> str:
    """What a version holds, in words: ``the state after batch 5``, or ``the rescale of batch 4`` (see
    :func:`batch_label`). Never derived from the version number."""
    return f"the {batch_label(batch_id, rescale=True)}" if rescale else f"the state after batch {batch_id}"
