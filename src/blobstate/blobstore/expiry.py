"""The check, when a query starts, that its checkpoint's pending objects expire.

Objects of versions that never commit are marked pending; on S3 only a bucket lifecycle rule deletes
them. :func:`warn_unless_pending_objects_expire` logs one warning naming the bucket and the rule to add
when the rule is missing (or a rule would delete committed state), and one debug line when the check
cannot be made. It never fails the query: the state is correct either way, only storage grows.
"""

from __future__ import annotations

import logging

from blobstate.blobstore.base import BlobStore, ExpiryCheck

log = logging.getLogger(__name__)


def warn_unless_pending_objects_expire(store: BlobStore) -> ExpiryCheck:
    """Check ``store`` (:meth:`BlobStore.check_expiry`) and log the outcome: a warning for a problem, a
    debug line when the check could not be made, nothing when pending objects expire. Returns the check.

    Call it once per query, at its start. Any error of the check itself is logged at debug level too.
    """
    try:
        check = store.check_expiry()
    except Exception as error:  # a failed check must never stop the query
        check = ExpiryCheck(unknown=f"the check failed: {type(error).__name__}: {error}")
    if check.problem is not None:
        log.warning("checkpoint %s: %s", store.url, check.problem)
    elif check.unknown is not None:
        log.debug("checkpoint %s: not checking that pending objects expire: %s", store.url, check.unknown)
    return check
