"""Makes ``spark.read.format("blobstate")`` work right after installation.

PySpark 4 registers Python data sources by itself: at a session's first data source lookup it imports
every top-level module whose name starts with ``pyspark_`` and registers its ``DefaultSource``. This
module is that entry point for :class:`blobstate.reader.datasource.BlobstateDataSource`; nothing else
lives here.
"""

from blobstate.reader.datasource import BlobstateDataSource as DefaultSource

__all__ = ["DefaultSource"]
