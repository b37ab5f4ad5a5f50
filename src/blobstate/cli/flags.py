"""Boolean flags shown as flags in ``--help``.

Typer 0.29 labels every option with its Python type, so a flag reads ``--json <bool>`` as though it took
a value. Flags (and counters) take none: their type column is left empty.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperOption

_display_type_rich = TyperOption.display_type_rich


def _flag_aware(self: TyperOption, ctx: Any) -> str | None:
    if self.is_flag or self.count:
        return None
    return _display_type_rich(self, ctx)


def install() -> None:
    """Leave the type column of flags empty in every command's help (idempotent)."""
    TyperOption.display_type_rich = _flag_aware  # type: ignore[method-assign]
