"""Hot standby replicas and failover (docs/DESIGN.md, "Placement and standby").

* :mod:`blobstate.standby.assignment`: which executor runs each partition and which keep its replicas
  (pure planning: Invariant 1, stickiness, failover to the most up-to-date standby, warm-up moves);
* :mod:`blobstate.standby.replica`: the executor side of a replica (sync to a committed version,
  stoppable; Invariant 2);
* :mod:`blobstate.standby.syncer`: the driver side (sync jobs after each commit, overlapping the next
  batch).
"""
