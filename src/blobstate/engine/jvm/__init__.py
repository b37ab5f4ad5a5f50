"""Implementations of the JVM seam (:class:`blobstate.batch.jvm.JvmSeam`); :func:`seam_for` picks one.

``classic.py`` drives a classic session's JVM through py4j; it is the only module of blobstate that does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blobstate.batch.jvm import JvmSeam

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def seam_for(spark: SparkSession) -> JvmSeam:
    """The JVM seam of ``spark``: through blobstate's server plugin for a Spark Connect session, else
    the classic (py4j) one."""
    from blobstate.batch.jvm import is_connect
    from blobstate.engine.jvm.connect import ConnectJvm

    if is_connect(spark):
        return ConnectJvm(spark)
    from blobstate.engine.jvm.classic import ClassicJvm

    return ClassicJvm(spark)


__all__ = ["JvmSeam", "seam_for"]
