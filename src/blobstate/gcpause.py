"""Pausing Python's cyclic garbage collector around bulk work that builds many acyclic objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many acyclic objects (bytes, tuples of bytes): its passes over
    a large heap would otherwise dominate the work. Restores the previous state."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
