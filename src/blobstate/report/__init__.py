"""Per-batch metrics of a query checkpoint (``blobstate report`` and ``blobstate lineage``).

:mod:`blobstate.report.metrics` turns the commit log into a table of per-batch metrics (pure, no
Spark, no plotting); :mod:`blobstate.report.render` draws it as one self-contained HTML page with PNG
plots (needs matplotlib: ``pip install 'blobstate[report]'``).
"""

from blobstate.report.metrics import BatchMetrics, CheckpointSummary, PartitionMetrics, batch_metrics

__all__ = ["BatchMetrics", "CheckpointSummary", "PartitionMetrics", "batch_metrics"]
