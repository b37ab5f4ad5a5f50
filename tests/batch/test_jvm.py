"""What both JVM seams share: the executors read off Spark's block managers, and telling a Connect
session from a classic one."""

from __future__ import annotations

from blobstate.batch.executor import ExecutorIdentity
from blobstate.batch.jvm import executors_from_block_managers, is_connect


def test_executors_come_in_spark_s_numeric_id_order_without_the_driver_off_local_mode() -> None:
    entries = ["10\t127.0.0.3", "driver\t127.0.0.1", "2\t127.0.0.2", "1\t127.0.0.4"]
    assert executors_from_block_managers(entries, local=False) == [
        ExecutorIdentity("1", "127.0.0.4"),
        ExecutorIdentity("2", "127.0.0.2"),
        ExecutorIdentity("10", "127.0.0.3"),
    ]


def test_in_local_mode_the_driver_is_the_executor() -> None:
    assert executors_from_block_managers(["driver\t192.0.2.2"], local=True) == [
        ExecutorIdentity("driver", "192.0.2.2")
    ]


def test_a_connect_session_is_told_by_its_class() -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    class Classic:
        pass

    assert not is_connect(Classic())
    assert is_connect(ConnectSession.__new__(ConnectSession))
