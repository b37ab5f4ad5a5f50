"""The Azure lifecycle management policy that deletes pending blobs (no Azure SDK here).

Pending blobs carry the blob index tag ``blobstate-pending=true``; committed ones do not. The policy's
rule deletes block blobs under ``container/prefix`` whose tag matches, ``days`` after creation. An
account owner installs it once (management plane): ::

    python -m blobstate.blobstore.azure_lifecycle az://container/prefix [DAYS] > policy.json
    az storage account management-policy create --account-name ACCOUNT --resource-group GROUP \\
        --policy @policy.json

An account has one policy: merge the rule into an existing policy rather than replacing it. Azure runs
policies about once a day; azurite does not run them at all.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from blobstate.blobstore.s3_lifecycle import PENDING_TAG_KEY, PENDING_TAG_VALUE


def rule_name(container: str, prefix: str) -> str:
    """The policy rule's name for ``container/prefix`` (letters, digits and hyphens, as Azure asks)."""
    raw = f"blobstate-pending-{container}-{prefix}".rstrip("-/")
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw)[:256]


def lifecycle_policy(container: str, prefix: str, days: int) -> dict[str, Any]:
    """A management policy with one rule deleting blobs tagged pending under ``container/prefix``."""
    if days < 1:
        raise ValueError(f"lifecycle expiry must be at least 1 day, got {days}")
    rule = {
        "enabled": True,
        "name": rule_name(container, prefix),
        "type": "Lifecycle",
        "definition": {
            "actions": {"baseBlob": {"delete": {"daysAfterCreationGreaterThan": days}}},
            "filters": {
                "blobTypes": ["blockBlob"],
                "prefixMatch": [f"{container}/{prefix}"],
                "blobIndexMatch": [{"name": PENDING_TAG_KEY, "op": "==", "value": PENDING_TAG_VALUE}],
            },
        },
    }
    return {"rules": [rule]}


def main(argv: list[str] | None = None) -> int:
    """Print the policy for an Azure store URL (and optional days) as JSON."""
    from blobstate.blobstore.azure_options import parse_azure_url

    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print(
            "usage: python -m blobstate.blobstore.azure_lifecycle az://container/prefix [DAYS]",
            file=sys.stderr,
        )
        return 2
    location = parse_azure_url(args[0])
    days = int(args[1]) if len(args) == 2 else 30
    print(json.dumps(lifecycle_policy(location.container, location.prefix, days), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
