"""Adjunct stores: side streams materialized into read-only stores the processor reads.

Declare one with :class:`Adjunct` and pass it to ``transform_with_state(adjuncts=[...])``; read it in the
processor with ``handle.getAdjunct(name)`` (:class:`~blobstate.adjunct.view.AdjunctView`).
"""

from blobstate.adjunct.spec import Adjunct, AdjunctError, AdjunctRecordError
from blobstate.adjunct.view import AdjunctView

__all__ = ["Adjunct", "AdjunctError", "AdjunctRecordError", "AdjunctView"]
