"""The S3 lifecycle rule that expires pending objects, and the check that a bucket's rules do so.

Pending objects carry the tag ``blobstate-pending=true``; committed ones carry no tags. A bucket's rules
expire pending objects under a store's prefix when one enabled rule with an expiration covers the whole
prefix and asks for no tag other than the pending tag and no object size. A rule that expires objects
without asking for the pending tag would delete committed state, so it is reported as a problem too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PENDING_TAG_KEY = "blobstate-pending"
PENDING_TAG_VALUE = "true"
PENDING_TAGGING = f"{PENDING_TAG_KEY}={PENDING_TAG_VALUE}"


def rule_id(prefix: str) -> str:
    """The id of blobstate's rule for the key prefix ``prefix`` (one rule per prefix of a bucket)."""
    return f"blobstate-pending:{prefix}" if prefix else "blobstate-pending"


def pending_rule(prefix: str, days: int) -> dict[str, Any]:
    """The rule expiring objects tagged pending under ``prefix`` ``days`` after they were written."""
    if days < 1:
        raise ValueError(f"lifecycle expiry must be at least 1 day, got {days}")
    tag = {"Key": PENDING_TAG_KEY, "Value": PENDING_TAG_VALUE}
    filter_ = {"And": {"Prefix": prefix, "Tags": [tag]}} if prefix else {"Tag": tag}
    return {"ID": rule_id(prefix), "Filter": filter_, "Status": "Enabled", "Expiration": {"Days": days}}


@dataclass(frozen=True)
class _Scope:
    """Which objects a rule applies to."""

    prefix: str
    tags: frozenset[tuple[str, str]]
    sized: bool  # limited to objects above or below a size


def _scope(rule: dict[str, Any]) -> _Scope:
    filter_ = rule.get("Filter")
    if filter_ is None:  # the old form: a prefix on the rule itself
        return _Scope(str(rule.get("Prefix", "")), frozenset(), False)
    body = filter_.get("And", filter_)
    tags = list(body.get("Tags", []))
    if "Tag" in body:
        tags.append(body["Tag"])
    sized = "ObjectSizeGreaterThan" in body or "ObjectSizeLessThan" in body
    return _Scope(str(body.get("Prefix", "")), frozenset((t["Key"], t["Value"]) for t in tags), sized)


def _expires(rule: dict[str, Any]) -> bool:
    expiration = rule.get("Expiration") or {}
    return rule.get("Status") == "Enabled" and ("Days" in expiration or "Date" in expiration)


def expiry_problem(
    rules: list[dict[str, Any]], bucket: str, prefix: str, url: str, days: int = 30
) -> str | None:
    """None when ``rules`` expire the pending objects under ``prefix``, else what is wrong and the fix
    (the rule to add, expiring pending objects ``days`` after creation, and the command that adds it)."""
    pending = (PENDING_TAG_KEY, PENDING_TAG_VALUE)
    where = f"prefix {prefix!r} of bucket {bucket!r}" if prefix else f"bucket {bucket!r}"
    for rule in rules:
        scope = _scope(rule)
        overlaps = prefix.startswith(scope.prefix) or scope.prefix.startswith(prefix)
        if _expires(rule) and overlaps and not scope.tags:
            under = f"under {scope.prefix!r}" if scope.prefix else "in the bucket"
            return (
                f"lifecycle rule {rule.get('ID', '<no id>')!r} of bucket {bucket!r} expires every object"
                f" {under}, so it would delete committed state under {where}:"
                f" limit it to objects tagged {PENDING_TAGGING} or remove it"
            )
    for rule in rules:
        scope = _scope(rule)
        if _expires(rule) and prefix.startswith(scope.prefix) and scope.tags <= {pending} and not scope.sized:
            return None
    ours = next((r for r in rules if r.get("ID") == rule_id(prefix)), None)
    if ours is not None and ours.get("Status") != "Enabled":
        what = f"lifecycle rule {rule_id(prefix)!r} of bucket {bucket!r} is disabled"
    else:
        what = f"no enabled lifecycle rule expires pending objects (tag {PENDING_TAGGING}) under {where}"
    tagged_where = f"under {prefix!r}" if prefix else "in the bucket"
    return (
        f"{what}, so objects of uncommitted versions are never deleted: add lifecycle rule"
        f" {rule_id(prefix)!r} (expire objects tagged {PENDING_TAGGING} {tagged_where} {days} days after"
        f" creation) with `blobstate gc {url} --install-lifecycle` (needs s3:PutLifecycleConfiguration)"
    )
