"""The Spark Connect JVM seam: :class:`~blobstate.batch.jvm.JvmSeam` through blobstate's server plugin.

A Spark Connect client has no JVM in its process. blobstate reaches the server's JVM through its Connect
server plugin (``java/ConnectPlugin.java``, registered on the server with
``spark.connect.extensions.relation.classes``): each question is a relation extension, a
``google.protobuf.Any`` of type :data:`CALL_TYPE` whose value is a JSON object ``{"op", "args",
"children"}`` (children: the serialized plans of DataFrames the call works on). The plugin answers with
the wrapped DataFrame (preferred locations, partition groups, the committed-only view) or with a one-row
relation whose ``answer`` column is JSON. Both ends run the same code as the classic seam behind them.

What needs no plugin uses Spark Connect itself: Arrow data to a DataFrame, the grouping columns of a
``groupBy``.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from blobstate.batch.executor import ExecutorIdentity
from blobstate.batch.jvm import (
    DeclaredWatermark,
    SourceLeaf,
    by_state_partition,
    executors_from_block_managers,
)
from blobstate.blobstore.redact import redact
from blobstate.engine.placement import PlacementUnavailableError
from blobstate.errors import first_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, GroupedData, SparkSession
    from pyspark.sql.types import StructType

logger = logging.getLogger("blobstate.engine.placement")

CALL_TYPE = "type.googleapis.com/blobstate.Call"
"""The type URL of blobstate's relation extensions (``ConnectPlugin.CALL_TYPE``)."""

PLUGIN_CLASS = "org.apache.spark.sql.blobstate.ConnectPlugin"
"""The plugin class a Connect server registers (``spark.connect.extensions.relation.classes``)."""


class ConnectPluginMissingError(PlacementUnavailableError):
    """The Spark Connect server does not answer blobstate's requests: its plugin is not installed."""


def plugin_missing_message(cause: str) -> str:
    """One line naming what the server lacks and how to start it with blobstate's plugin."""
    return (
        "blobstate needs its Spark Connect server plugin, and the server does not answer it"
        f" ({cause}): start the Connect server with the arguments `blobstate connect-server-args` prints"
        f" (--jars <blobstate's jar> --conf spark.connect.extensions.relation.classes={PLUGIN_CLASS});"
        ' see the README\'s "Spark Connect"'
    )


def _call_plan(op: str, args: dict[str, Any], children: Sequence[DataFrame]) -> Any:
    """A Connect logical plan node holding one call (``children``: the DataFrames it works on)."""
    import pyspark.sql.connect.proto as proto
    from google.protobuf import any_pb2  # type: ignore[import-untyped]
    from pyspark.sql.connect.plan import LogicalPlan

    # One id per DataFrame: the plugin answers a wrapping call it has seen with the plan it built then,
    # so a persisted stage and the actions on it are one plan (one RDD), as on a classic session.
    call_id = uuid.uuid4().hex

    class _Call(LogicalPlan):
        def __init__(self) -> None:
            super().__init__(None)

        def plan(self, session: Any) -> proto.Relation:
            relation = self._create_proto_relation()
            plans: list[Any] = [child._plan for child in children]  # Connect DataFrames' plans
            kids = [base64.b64encode(p.plan(session).SerializeToString()).decode("ascii") for p in plans]
            value = json.dumps({"op": op, "args": args, "children": kids, "id": call_id})
            relation.extension.CopyFrom(any_pb2.Any(type_url=CALL_TYPE, value=value.encode("utf-8")))
            return relation

    return _Call()


class ConnectJvm:
    """:class:`~blobstate.batch.jvm.JvmSeam` for a Spark Connect session (see the module)."""

    def __init__(self, spark: SparkSession) -> None:
        """The seam of ``spark``; nothing is asked of the server until an operation needs it."""
        self._spark = spark
        self._local: bool | None = None

    @property
    def spark(self) -> SparkSession:
        """The session this seam drives."""
        return self._spark

    # ------------------------------------------------------------------ calls
    def _frame(self, op: str, args: dict[str, Any], children: Sequence[DataFrame] = ()) -> DataFrame:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame

        return ConnectFrame(_call_plan(op, args, children), self._spark)  # type: ignore[arg-type]

    def _ask(self, op: str, args: dict[str, Any] | None = None, children: Sequence[DataFrame] = ()) -> Any:
        """The JSON answer of one call."""
        (row,) = self._frame(op, args or {}, children).collect()
        return json.loads(row[0])

    # ------------------------------------------------------------------ the session
    def watermarks(self, df: DataFrame) -> list[DeclaredWatermark]:
        """Every ``withWatermark`` of ``df``'s analyzed plan, read by the plugin."""
        return [DeclaredWatermark(**w) for w in self._ask("watermarks", children=[df])]

    def streaming_leaves(self, df: DataFrame) -> list[SourceLeaf]:
        """The leaves of ``df``'s analyzed plan, read by the plugin."""
        return [_leaf(x) for x in self._ask("leaves", children=[df])]

    def plain_source(self, df: DataFrame) -> SourceLeaf | None:
        """The ``StreamingRelation`` under ``df``'s aliases and plain projections, read by the plugin."""
        found = self._ask("plain_source", children=[df])
        return None if found is None else _leaf(found)

    def grouping_columns(self, grouped: GroupedData) -> list[str]:
        """The grouping columns of ``df.groupBy(...)``: the leading columns of its ``count()``."""
        return list(grouped.count().columns[:-1])

    def frame_from_arrow(self, batches: list[pa.RecordBatch], schema: StructType) -> DataFrame:
        """``createDataFrame`` of the batches (Connect sends Arrow data as it is)."""
        import pyarrow as pa

        table = pa.Table.from_batches(batches) if batches else None
        if table is None:
            return self._spark.createDataFrame([], schema)
        return self._spark.createDataFrame(table, schema=schema)

    def stage_resubmitted_at(self, stage_id: int) -> float | None:
        """When Spark submitted the last attempt of stage ``stage_id`` if it ran it more than once."""
        try:
            at = self._ask("stage_resubmitted_at", {"stage": int(stage_id)})
        except Exception:  # a server that forgot the stage: no resubmission known
            return None
        return None if at is None else float(at) / 1000.0

    def reads_spark_files(self) -> bool:
        """True: the plugin reads Spark's checkpoint files on the server."""
        return True

    def read_file(self, uri: str) -> bytes:
        """A whole file through the server's Hadoop filesystem."""
        return base64.b64decode(self._ask("read_file", {"uri": uri}))

    def list_dir(self, uri: str) -> list[str]:
        """The names in a directory through the server's Hadoop filesystem (hidden ones left out)."""
        return sorted(n for n in self._ask("list_dir", {"uri": uri}) if not n.startswith("."))

    def file_exists(self, uri: str) -> bool:
        """Whether a file exists, through the server's Hadoop filesystem."""
        return bool(self._ask("file_exists", {"uri": uri}))

    def python_worker(self) -> tuple[str, str] | None:
        """None: the executors' Python is checked by the server's own Python workers as they run."""
        return None

    def run_probe(self, probe: Callable[[Iterable[Any]], Iterable[Any]], description: str) -> Any:
        """Not used over Spark Connect (:meth:`python_worker` is None)."""
        raise NotImplementedError("the executor probe does not run over Spark Connect")

    # ------------------------------------------------------------------ blobstate's JVM helper
    def load_helper(self) -> bool:
        """Whether the server answers blobstate's plugin; False after one warning when it does not."""
        try:
            self.require_plugin()
        except ConnectPluginMissingError as error:
            logger.warning("%s", error)
            return False
        return True

    def require_plugin(self) -> None:
        """Raise :class:`ConnectPluginMissingError` (one line) unless the server answers the plugin."""
        try:
            self._ask("ping")
        except Exception as error:
            raise ConnectPluginMissingError(plugin_missing_message(redact(first_line(error)))) from None

    def executors(self) -> list[ExecutorIdentity]:
        """The executors alive now; in local mode the single executor ``"driver"``."""
        if self._local is None:
            self._local = bool(self._ask("is_local"))
        return executors_from_block_managers(self._ask("executors"), self._local)

    def by_state_partition(
        self, df: DataFrame, key_columns: Sequence[str], partition_column: str, num_partitions: int
    ) -> DataFrame:
        """``batch.jvm.by_state_partition``, with the client's DataFrame operations."""
        return by_state_partition(df, key_columns, partition_column, num_partitions)

    def with_preferred_locations(self, df: DataFrame, locations: Sequence[str | None]) -> DataFrame:
        """``df`` wrapped by the plugin with partition ``i`` preferring ``locations[i]``."""
        return self._frame("preferred_locations", {"locations": list(locations)}, [df])

    def with_partition_groups(
        self, df: DataFrame, groups: Sequence[Sequence[int]], locations: Sequence[str | None]
    ) -> DataFrame:
        """``df`` regrouped by the plugin: partition ``g`` reads ``df``'s partitions ``groups[g]`` in
        order and prefers ``locations[g]``."""
        args = {"groups": [[int(i) for i in group] for group in groups], "locations": list(locations)}
        return self._frame("partition_groups", args, [df])

    def committed_only(
        self, stage: DataFrame, uid_column: str, meta_column: str, uids: Sequence[str], what: str
    ) -> DataFrame:
        """The committed-only view of the persisted ``stage``, built by the plugin (an entry of ``uids``
        may list several uids, joined by commas)."""
        args = {"uid_column": uid_column, "meta_column": meta_column, "uids": list(uids), "what": what}
        return self._frame("committed_only", args, [stage])

    def write_through(self, stage: DataFrame, uid_column: str, meta_column: str, what: str) -> Any:
        """Not over Spark Connect yet: the query refuses a write-through sink there at start."""
        raise PlacementUnavailableError("a write-through sink does not run over Spark Connect yet")

    def ticks_channel(self) -> _Ticks:
        """The ticks source's driver end, in the server's JVM."""
        return _Ticks(self)

    def metrics_channel(self) -> _Metrics:
        """The queries' metrics sources, in the server's JVM."""
        return _Metrics(self)


class _Ticks:
    """``TicksSource``'s entry points through the plugin."""

    def __init__(self, seam: ConnectJvm) -> None:
        self._seam = seam

    def request(self, token: str, batch_id: int) -> None:
        """``TicksSource.request``."""
        self._seam._ask("ticks_request", {"token": token, "offset": int(batch_id)})

    def publish(self, token: str, keys: list[str], values: list[str]) -> None:
        """``TicksSource.publish``."""
        self._seam._ask("ticks_publish", {"token": token, "keys": keys, "values": values})

    def release(self, token: str) -> None:
        """``TicksSource.release``."""
        self._seam._ask("ticks_release", {"token": token})


class _Metrics:
    """``QueryMetrics``'s entry points through the plugin."""

    def __init__(self, seam: ConnectJvm) -> None:
        self._seam = seam

    def update(self, name: str, names: list[str], values: list[float]) -> None:
        """``QueryMetrics.update``."""
        self._seam._ask("metrics_update", {"name": name, "names": names, "values": values})

    def remove(self, name: str) -> None:
        """``QueryMetrics.remove``."""
        self._seam._ask("metrics_remove", {"name": name})


def _leaf(raw: dict[str, Any]) -> SourceLeaf:
    return SourceLeaf(
        node=str(raw["node"]),
        format=raw.get("format"),
        options={str(k): str(v) for k, v in (raw.get("options") or {}).items()},
        schema_json=raw.get("schema_json"),
    )
