"""The bound on a checkpoint's partition count, shared by a query's ``num_partitions`` and a rescale."""

MAX_PARTITIONS = 10_000
"""The most state partitions a checkpoint may have (a query's ``num_partitions``, a rescale's target):
each is a RocksDB store, a task and a delta per batch; far more than a cluster's cores only adds that."""
