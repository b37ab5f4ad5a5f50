"""What one listing of a create-only log pruned below a horizon found: the commit log (``commits/``) and
a backup repository's head log (``heads/``) both keep one record per version, and their newest record
says below which version records may be pruned. A version missing from the horizon up is a hole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class HorizonRecord(Protocol):
    """A log record that declares its log's horizon."""

    @property
    def horizon(self) -> int: ...


RecordT = TypeVar("RecordT", bound=HorizonRecord)


@dataclass(frozen=True)
class HorizonScan(Generic[RecordT]):
    """The versions one listing found and the newest record."""

    versions: list[int]
    """Every version with a record, ascending (pruned ones below the horizon may still be among them)."""
    newest: RecordT | None

    @property
    def latest(self) -> int:
        """The newest version (0: none)."""
        return self.versions[-1] if self.versions else 0

    @property
    def horizon(self) -> int:
        """The newest record's horizon: records below it may be pruned (1 without records)."""
        return self.newest.horizon if self.newest is not None else 1

    @property
    def holes(self) -> list[int]:
        """Versions from the horizon to the newest without a record."""
        present = set(self.versions)
        return [v for v in range(self.horizon, self.latest + 1) if v not in present]

    @property
    def prunable(self) -> list[int]:
        """Versions below the horizon whose records are still there (pruning not finished)."""
        return [v for v in self.versions if v < self.horizon]


__all__ = ["HorizonRecord", "HorizonScan"]
