"""What an adjunct store does when a query starts: the recovery decision table.

The table is documented in docs/DESIGN.md ("Adjunct stores") and the README ("Side streams").

|                       | store not found      | found but not valid     | found and valid |
|-----------------------|----------------------|-------------------------|-----------------|
| side stream bootstrap | create it; bootstrap | re-create it; bootstrap | continue        |
| no bootstrap          | create it; continue  | re-create it; continue  | continue        |

*Found* means the checkpoint's last commit records the store. A persistent store is *not valid* when it
has not changed for longer than its ``max_age_seconds`` or when its side source no longer has the data
up to the recorded offset (a file source's files deleted since); a non-persistent store is never kept
across starts (found means re-created). *Bootstrap* means no main row is processed before the store holds the
side stream up to its offset at start: for a new store, main rows wait (kept in the partition's state)
while a rate-limited side stream still has backlog; for a re-created one, the side stream's history up
to the offset Spark recorded is read again before the first batch's main rows. *Continue* means the side
stream goes on from the offset in Spark's checkpoint and the store is updated as its rows arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOT_FOUND = "not found"
INVALID = "found but not valid"
VALID = "found and valid"


@dataclass(frozen=True)
class StartDecision:
    """What one adjunct store does at this start of the query."""

    name: str
    found: str
    """``NOT_FOUND``, ``INVALID`` or ``VALID``."""
    recreate: bool
    """Empty the store before the first batch of this run applies side rows."""
    reload: bool
    """Re-read the side stream's history up to the offset Spark recorded, in the first batch."""
    wait_for_backlog: bool
    """Hold main rows (in the partition's state) until the side stream's backlog is loaded."""
    reason: str

    def to_json(self) -> dict[str, Any]:
        """As recorded in the commit of the batch that applied it."""
        return {"found": self.found, "recreate": self.recreate, "reload": self.reload, "reason": self.reason}


def decide(
    spec: Any,
    recorded: dict[str, Any] | None,
    now_ms: int,
    *,
    rate_limited: bool = False,
    lost: list[str] | None = None,
) -> StartDecision:
    """The decision for adjunct ``spec`` given what the last commit records of it (None: not found).

    ``rate_limited``: the side source takes part of its backlog per batch, so a bootstrap of a new
    store holds main rows until the backlog is in (otherwise the first batch takes all of it).
    ``lost``: what the side source no longer has of the recorded offset (files deleted since): a store
    built from it is not valid (a reload reads what the source still has).
    """
    name = spec.name
    if recorded is None:
        if not spec.bootstrap:
            how = "continue from the side offset"
        elif rate_limited:
            how = "bootstrap: main rows wait until the rate-limited side stream's backlog is loaded"
        else:
            how = "bootstrap: the first batch loads the side stream's backlog before its main rows"
        wait = spec.bootstrap and rate_limited
        return StartDecision(name, NOT_FOUND, False, False, wait, f"new store; {how}")
    if not spec.persistent:
        found, why = INVALID, "not persistent"
    elif lost:
        found, why = (
            INVALID,
            f"the side source no longer has {len(lost)} file(s) of its recorded offset ({lost[0]})",
        )
    elif spec.max_age_seconds is not None:
        updated = recorded.get("updated_ms")
        age = (now_ms - int(updated)) / 1000 if isinstance(updated, (int, float)) else float("inf")
        if age > spec.max_age_seconds:
            found, why = (
                INVALID,
                f"last updated {age:.0f} s ago, more than max_age_seconds={spec.max_age_seconds}",
            )
        else:
            found, why = VALID, f"last updated {age:.0f} s ago"
    else:
        found, why = VALID, "persistent"
    if found == VALID:
        return StartDecision(name, VALID, False, False, False, f"{why}; continue from the recorded offset")
    if spec.bootstrap:
        return StartDecision(name, INVALID, True, True, False, f"{why}; re-created and reloaded")
    return StartDecision(
        name, INVALID, True, False, False, f"{why}; re-created, continue from the side offset"
    )
