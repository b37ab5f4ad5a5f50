"""The classic JVM seam: :class:`~blobstate.batch.jvm.JvmSeam` through py4j, in the driver's JVM.

A classic ``SparkSession`` runs Spark's JVM beside this Python process and reaches it through py4j:
the session's ``_jvm``, ``_jsc`` and ``_jsparkSession``, a DataFrame's ``_jdf``. This module is the one
place blobstate does (``tests/test_import_graph.py`` checks it): :class:`ClassicJvm` answers every
question the engine and its features ask of the JVM, and :class:`PlacementHelper` is blobstate's JVM
helper (``engine/java/*.java``) loaded into the driver and shipped to the executors, its jar found by
``engine/placement.py``.

Without a fitting shipped jar and a JDK, or when compilation or loading fails, ``PlacementHelper.get``
returns None after logging one warning (the query then refuses to start, naming why); a Spark Connect
session is one ``SparkConnectUnsupportedError``.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobstate.batch.executor import ExecutorIdentity
from blobstate.batch.jvm import (
    DeclaredWatermark,
    MetricsChannel,
    ProbeFailedError,
    SourceLeaf,
    TicksChannel,
    by_state_partition,
    executors_from_block_managers,
)
from blobstate.engine.placement import (
    HELPER_CLASS,
    SPARK_CONNECT_MESSAGE,
    PlacementUnavailableError,
    SparkConnectUnsupportedError,
    default_cache_dir,
    find_javac,
    helper_jar,
)
from blobstate.errors import first_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, GroupedData, SparkSession
    from pyspark.sql.types import StructType

# The placement warning keeps the logger it always had.
logger = logging.getLogger("blobstate.engine.placement")

WATERMARK_NODE = "EventTimeWatermark"
"""The logical plan node ``withWatermark`` adds."""

STREAMING_RELATION = "StreamingRelation"
"""A V1 streaming source's plan node (file sources among them)."""

STREAMING_RELATION_V2 = "StreamingRelationV2"
"""A V2 streaming source's plan node."""

# One entry per SparkContext (or Spark Connect session) and toolchain settings, failures included, so
# an unavailable helper is reported exactly once.
_HELPERS: weakref.WeakKeyDictionary[Any, dict[tuple[str | None, Path], PlacementHelper | None]] = (
    weakref.WeakKeyDictionary()
)
_HELPERS_LOCK = threading.Lock()
HELPER_PACKAGE, HELPER_ENTRY = HELPER_CLASS.rsplit(".", 1)
"""The Java package of the helper's classes, and the name of its entry class (``PreferredLocations``)."""


def _checked_locations(locations: Sequence[str | None]) -> list[str | None]:
    """``locations`` as a list, each entry a location string or None (else a TypeError naming it)."""
    values = list(locations)
    for i, value in enumerate(values):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"preferred location {i} must be a str or None, not {type(value).__name__}")
    return values


class PlacementHelper:
    """The loaded JVM helper of one SparkContext: preferred locations, partition groups and the live
    executors."""

    def __init__(self, spark: SparkSession, jar: Path) -> None:
        """Use ``PlacementHelper.get`` or ``PlacementHelper.load``; this assumes the jar is loaded."""
        self._spark = spark
        self._jar = jar
        # The helper's py4j classes, per thread: a lookup by package path costs a py4j call per name
        # segment, and the class loader is checked per JVM thread (pinned to the Python thread).
        self._classes = threading.local()

    @property
    def jar(self) -> Path:
        """The helper jar loaded into this session."""
        return self._jar

    @classmethod
    def get(cls, spark: SparkSession) -> PlacementHelper | None:
        """The helper for ``spark``'s SparkContext, built and loaded on first use.

        Returns None, after logging one warning per SparkContext, when placement is unavailable (no
        shipped jar for this Spark and no JDK, compilation or loading failed). Raises
        ``SparkConnectUnsupportedError`` for a Spark Connect session: one error naming the limitation.
        """
        if not _is_classic(spark):
            raise SparkConnectUnsupportedError(SPARK_CONNECT_MESSAGE)
        owner = spark.sparkContext
        settings = (find_javac(), default_cache_dir())
        with _HELPERS_LOCK:
            per_owner = _HELPERS.setdefault(owner, {})
            if settings in per_owner:
                return per_owner[settings]
            try:
                helper: PlacementHelper | None = cls.load(spark, javac=settings[0], cache_dir=settings[1])
            except PlacementUnavailableError as e:
                logger.warning(
                    "blobstate executor placement is unavailable, tasks will run where Spark puts them "
                    "(state stays correct, but may be restored on other executors): %s",
                    e,
                )
                helper = None
            per_owner[settings] = helper
            return helper

    @classmethod
    def load(
        cls, spark: SparkSession, *, javac: str | None = None, cache_dir: Path | None = None
    ) -> PlacementHelper:
        """Build (if needed) and load the helper into ``spark``; raises ``PlacementUnavailableError``."""
        if not _is_classic(spark):
            raise SparkConnectUnsupportedError(SPARK_CONNECT_MESSAGE)
        jvm = _jvm_of(spark)
        classpath = jvm.java.lang.System.getProperty("java.class.path")
        jar = helper_jar(spark.version, classpath, cache_dir=cache_dir, javac=javac)
        helper = cls(spark, jar)
        helper._helper_class()  # loads it into the driver, or raises
        try:
            # Executors fetch the jar from the driver and load it before deserializing tasks.
            spark.sparkContext._jsc.addJar(str(jar))
        except Exception as e:
            raise PlacementUnavailableError(f"cannot ship {jar} to the executors: {e}") from e
        return helper

    def by_state_partition(
        self, df: DataFrame, key_columns: Sequence[str], partition_column: str, num_partitions: int
    ) -> DataFrame:
        """``batch.jvm.by_state_partition`` built by the JVM (``PreferredLocations.byStatePartition``):
        the same plan in one py4j call instead of one per column and operation."""
        from pyspark.sql import DataFrame

        jdf = self._helper_class().byStatePartition(
            df._jdf, json.dumps(list(key_columns)), partition_column, int(num_partitions)
        )
        return DataFrame(jdf, df.sparkSession)

    def with_preferred_locations(self, df: DataFrame, locations: Sequence[str | None]) -> DataFrame:
        """``df`` with the same rows in the same partitions, partition ``i`` preferring ``locations[i]``.

        ``locations`` has one entry per partition of ``df``: a location string (``location_string``),
        several joined by commas (candidates in order: the first executor alive when the stage is
        submitted is preferred, so a stage resubmitted after an executor loss goes to the next one),
        or None for no preference. Operators applied to the result without a shuffle (``mapInArrow``)
        run in the same stage, on the preferred executors, and their tasks can read their executor
        with ``current_executor()``. With adaptive query execution, the shuffle below ``df`` runs
        now, once; actions on the result reuse its output.
        """
        from pyspark.sql import DataFrame

        values = _checked_locations(locations)
        jdf = self._helper_class().withPreferredLocations(df._jdf, self._string_array(values))
        return DataFrame(jdf, df.sparkSession)

    def with_partition_groups(
        self, df: DataFrame, groups: Sequence[Sequence[int]], locations: Sequence[str | None]
    ) -> DataFrame:
        """``df``'s partitions regrouped without a shuffle: partition ``g`` of the result reads the
        partitions ``groups[g]`` of ``df`` one after the other, in that order, in one task, and prefers
        ``locations[g]`` (an entry as :meth:`with_preferred_locations` takes it).

        Every partition of ``df`` is in exactly one group and no group is empty; otherwise the JVM
        refuses with a message starting ``blobstate placement:``. The result keeps ``df``'s columns but
        claims no partitioning (its partitions are not ``df``'s). Operators applied to it without a
        shuffle (``mapInArrow``) run in the same stage, one task per group, on the preferred executors,
        and their tasks can read their executor with ``current_executor()``. With adaptive query
        execution, the shuffle below ``df`` runs now, once.
        """
        from pyspark.sql import DataFrame

        texts = []
        for g, group in enumerate(groups):
            if isinstance(group, str | bytes) or not isinstance(group, Sequence):
                raise TypeError(f"partition group {g} must be a sequence of int, not {type(group).__name__}")
            for index in group:
                if isinstance(index, bool) or not isinstance(index, int):
                    raise TypeError(
                        f"partition group {g} must hold int partition indices, not {type(index).__name__}"
                    )
            texts.append(",".join(str(int(index)) for index in group))
        values = _checked_locations(locations)
        jdf = self._helper_class().withPartitionGroups(
            df._jdf, self._string_array(texts), self._string_array(values)
        )
        return DataFrame(jdf, df.sparkSession)

    def committed_only(
        self, stage: DataFrame, uid_column: str, meta_column: str, uids: Sequence[str], what: str
    ) -> DataFrame:
        """The output rows of the persisted ``stage`` (``CommittedOutputs.committedOnly``): a task fails
        instead of passing on partition ``i`` when its header rows do not carry the uids of ``uids[i]``:
        one uid, or several joined by commas (a partition holding several state partitions' outputs,
        one header row each), in order, none missing and none beyond."""
        from pyspark.sql import DataFrame

        jdf = self.committed_outputs().committedOnly(
            stage._jdf, uid_column, meta_column, self._string_array(uids), what
        )
        return DataFrame(jdf, stage.sparkSession)

    def _string_array(self, values: Sequence[str | None]) -> Any:
        """A Java ``String[]`` holding ``values`` (None stays null), built in one py4j call."""
        return self._helper_class().stringArray(json.dumps(list(values)))

    def executors(self) -> list[ExecutorIdentity]:
        """The executors alive now, by executor id; in local mode the single executor ``"driver"``."""
        local = bool(self._spark.sparkContext._jsc.sc().isLocal())
        return executors_from_block_managers(self._helper_class().blockManagers(), local)

    def write_through(self) -> Any:
        """The py4j class ``WriteThrough`` (a stage's outputs to a writer, its metadata to an accumulator)."""
        return self._class("WriteThrough")

    def committed_outputs(self) -> Any:
        """The py4j class ``CommittedOutputs`` (the sink's checked view of a persisted stage)."""
        return self._class("CommittedOutputs")

    def ticks_source(self) -> Any:
        """The py4j class ``TicksSource`` (batches without input; metrics in Spark's progress)."""
        return self._class("TicksSource")

    def query_metrics(self) -> Any:
        """The py4j class ``QueryMetrics`` (a query's figures in Spark's metrics system)."""
        return self._class("QueryMetrics")

    def read_file(self, uri: str) -> bytes:
        """A whole file through Hadoop's ``FileSystem`` (``HadoopFiles.read``), in one py4j call."""
        configuration = self._spark.sparkContext._jsc.hadoopConfiguration()
        return bytes(self._class("HadoopFiles").read(uri, configuration))

    def _class(self, name: str) -> Any:
        """The helper's py4j class ``name`` (in the helper's package), looked up once per thread and
        made visible to this JVM thread's class loader (the jar added to it) when it is not."""
        from py4j.java_gateway import JavaClass

        found = getattr(self._classes, name, None)
        if found is not None:
            return found
        jvm = _jvm_of(self._spark)
        package = functools.reduce(getattr, HELPER_PACKAGE.split("."), jvm)
        found = getattr(package, name)
        if not isinstance(found, JavaClass):
            try:
                loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
                loader.addURL(jvm.java.io.File(str(self._jar)).toURI().toURL())
            except Exception as e:
                raise PlacementUnavailableError(
                    f"cannot add {self._jar} to the driver's class loader: {e}"
                ) from e
            found = getattr(package, name)
            if not isinstance(found, JavaClass):
                raise PlacementUnavailableError(
                    f"{HELPER_PACKAGE}.{name} is not visible after loading {self._jar}"
                )
        setattr(self._classes, name, found)
        return found

    def _helper_class(self) -> Any:
        """The helper's entry class ``PreferredLocations`` (:meth:`_class`)."""
        return self._class(HELPER_ENTRY)


def _is_classic(spark: SparkSession) -> bool:
    return getattr(spark, "_jsparkSession", None) is not None


def _jvm_of(spark: SparkSession) -> Any:
    """The py4j view of ``spark``'s JVM (classic Spark only; Spark Connect has none)."""
    jvm = spark._jvm
    if jvm is None:
        raise SparkConnectUnsupportedError(SPARK_CONNECT_MESSAGE)
    return jvm


class ClassicJvm:
    """:class:`~blobstate.batch.jvm.JvmSeam` for a classic ``SparkSession`` (see the module)."""

    def __init__(self, spark: SparkSession) -> None:
        """The seam of ``spark``; nothing is loaded or checked until an operation needs it."""
        self._spark = spark
        self._loaded: PlacementHelper | None = None

    @property
    def spark(self) -> SparkSession:
        """The session this seam drives."""
        return self._spark

    # ------------------------------------------------------------------ the session
    def watermarks(self, df: DataFrame) -> list[DeclaredWatermark]:
        """Every ``EventTimeWatermark`` node of ``df``'s analyzed plan, outermost first."""
        found, stack = [], [df._jdf.queryExecution().analyzed()]
        while stack:
            node = stack.pop()
            if node.nodeName() == WATERMARK_NODE:
                found.append(node)
            children = node.children()
            stack.extend(children.apply(i) for i in reversed(range(children.size())))
        return [
            DeclaredWatermark(
                event_time=str(node.eventTime().name()),
                delay=str(node.delay().toString()),
                months=_field(node.delay(), "months"),
                days=_field(node.delay(), "days"),
                microseconds=_field(node.delay(), "microseconds"),
            )
            for node in found
        ]

    def streaming_leaves(self, df: DataFrame) -> list[SourceLeaf]:
        """The leaves of ``df``'s analyzed plan (``collectLeaves``), with the options of streaming ones."""
        leaves = df._jdf.queryExecution().analyzed().collectLeaves()
        return [_leaf(leaves.apply(i)) for i in range(leaves.size())]

    def plain_source(self, df: DataFrame) -> SourceLeaf | None:
        """The ``StreamingRelation`` under ``df``'s aliases and projections of plain columns, if any."""
        node = df._jdf.queryExecution().analyzed()
        while True:
            kind = node.getClass().getSimpleName()
            children = node.children()
            if kind == "Project":
                exprs = node.projectList()
                plain = all(
                    exprs.apply(i).getClass().getSimpleName() == "AttributeReference"
                    for i in range(exprs.size())
                )
                if not plain:
                    break
            elif kind not in ("SubqueryAlias",):
                break
            node = children.apply(0)
        if node.getClass().getSimpleName() != STREAMING_RELATION:
            return None
        return _leaf(node)

    def grouping_columns(self, grouped: GroupedData) -> list[str]:
        """The names of the grouping expressions of ``df.groupBy(...)``."""
        exprs = grouped._jgd.groupingExprs()
        return [str(exprs.apply(i).name()) for i in range(exprs.size())]

    def frame_from_arrow(self, batches: list[pa.RecordBatch], schema: StructType) -> DataFrame:
        """A DataFrame of ``batches`` with ``schema``, read by the JVM as it reads a ``mapInArrow`` stage's
        Arrow data (``ArrowConverters``): what ``createDataFrame`` does for an Arrow table without its
        Python-side conversions, which data already in the schema's Arrow types does not need."""
        from pyspark.sql import DataFrame
        from pyspark.sql.pandas.serializers import ArrowStreamSerializer

        spark: Any = self._spark
        jvm = spark._jvm
        rows = spark.sparkContext._serialize_to_jvm(
            batches,
            ArrowStreamSerializer(),
            jvm.PythonSQLUtils.readArrowStreamFromFile,
            jvm.ArrowIteratorServer,
        )
        frame = DataFrame(jvm.PythonSQLUtils.toDataFrame(rows, schema.json(), spark._jsparkSession), spark)
        frame._schema = schema
        return frame

    def stage_resubmitted_at(self, stage_id: int) -> float | None:
        """When Spark submitted the last attempt of stage ``stage_id``, from its status tracker."""
        try:
            info = self._spark.sparkContext._jsc.statusTracker().getStageInfo(int(stage_id))
            if info is None or int(info.currentAttemptId()) == 0:
                return None
            return int(info.submissionTime()) / 1000.0
        except Exception:  # no JVM (Spark Connect) or the stage was forgotten: no resubmission known
            return None

    def reads_spark_files(self) -> bool:
        """Whether the session's JVM is reachable here (not with Spark Connect)."""
        try:
            self._spark.sparkContext._jvm  # noqa: B018
        except Exception:
            return False
        return True

    def read_file(self, uri: str) -> bytes:
        """A whole file through Hadoop's ``FileSystem`` (Commons IO's ``toByteArray``; through the helper
        in one py4j call once it is loaded)."""
        if self._loaded is not None:
            return self._loaded.read_file(uri)
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        fs, path = self._hadoop_path(uri)
        stream = fs.open(path)
        try:
            return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def list_dir(self, uri: str) -> list[str]:
        """The names in a directory through Hadoop's ``FileSystem`` (hidden ones left out)."""
        fs, path = self._hadoop_path(uri)
        if not fs.exists(path):
            return []
        return sorted(
            str(s.getPath().getName())
            for s in fs.listStatus(path)
            if not s.getPath().getName().startswith(".")
        )

    def file_exists(self, uri: str) -> bool:
        """Whether a file exists, through Hadoop's ``FileSystem``."""
        fs, path = self._hadoop_path(uri)
        return bool(fs.exists(path))

    def _hadoop_path(self, uri: str) -> tuple[Any, Any]:
        """``(FileSystem, Path)`` of ``uri`` through Hadoop (any filesystem Spark can use)."""
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration()), path

    def python_worker(self) -> tuple[str, str] | None:
        """The SparkContext's application id and ``pythonExec``; None for a session without a JVM here."""
        if getattr(self._spark, "_jsparkSession", None) is None:
            return None
        context = self._spark.sparkContext
        return context.applicationId, str(context.pythonExec)

    def run_probe(self, probe: Callable[[Iterable[Any]], Iterable[Any]], description: str) -> Any:
        """``parallelize([0], 1).mapPartitions(probe).collect()``'s one item, the job named
        ``description``; a failed job is :class:`ProbeFailedError` with the task's own error."""
        from py4j.protocol import Py4JJavaError

        from blobstate.engine.executor_python import worker_error

        context = self._spark.sparkContext
        previous = context.getLocalProperty("spark.job.description")
        context.setJobDescription(description)
        try:
            (report,) = context.parallelize([0], 1).mapPartitions(probe).collect()
        except Py4JJavaError as error:
            java = getattr(error, "java_exception", None)
            cause = java.getCause() if java is not None else None
            failure = first_line(error) if cause is None else worker_error(str(cause.getMessage()))
            raise ProbeFailedError(failure) from None
        finally:
            context.setLocalProperty("spark.job.description", previous)  # type: ignore[arg-type]
        return report

    # ------------------------------------------------------------------ blobstate's JVM helper
    def load_helper(self) -> bool:
        """``PlacementHelper.get``: loaded once per SparkContext, None after one warning."""
        self._loaded = PlacementHelper.get(self._spark)
        return self._loaded is not None

    @property
    def helper(self) -> PlacementHelper:
        """The loaded helper (:meth:`load_helper` first)."""
        if self._loaded is None:
            raise PlacementUnavailableError("blobstate's JVM helper is not loaded into this session")
        return self._loaded

    def executors(self) -> list[ExecutorIdentity]:
        """The executors alive now (``PlacementHelper.executors``)."""
        return self.helper.executors()

    def by_state_partition(
        self, df: DataFrame, key_columns: Sequence[str], partition_column: str, num_partitions: int
    ) -> DataFrame:
        """``PlacementHelper.by_state_partition`` (one py4j call); ``batch.jvm.by_state_partition``
        without the helper."""
        if self._loaded is None:
            return by_state_partition(df, key_columns, partition_column, num_partitions)
        return self._loaded.by_state_partition(df, key_columns, partition_column, num_partitions)

    def with_preferred_locations(self, df: DataFrame, locations: Sequence[str | None]) -> DataFrame:
        """``PlacementHelper.with_preferred_locations``."""
        return self.helper.with_preferred_locations(df, locations)

    def with_partition_groups(
        self, df: DataFrame, groups: Sequence[Sequence[int]], locations: Sequence[str | None]
    ) -> DataFrame:
        """``PlacementHelper.with_partition_groups``."""
        return self.helper.with_partition_groups(df, groups, locations)

    def committed_only(
        self, stage: DataFrame, uid_column: str, meta_column: str, uids: Sequence[str], what: str
    ) -> DataFrame:
        """``PlacementHelper.committed_only``."""
        return self.helper.committed_only(stage, uid_column, meta_column, uids, what)

    def write_through(self, stage: DataFrame, uid_column: str, meta_column: str, what: str) -> _Tapped:
        """``WriteThrough.tapped``: the metadata rows go to a collection accumulator, which Spark merges
        for successful tasks only, once per task."""
        from pyspark.sql import DataFrame

        spark = stage.sparkSession
        metas = spark.sparkContext._jsc.sc().collectionAccumulator(f"blobstate metadata of {what}")
        through = self.helper.write_through()
        jdf = through.tapped(stage._jdf, uid_column, meta_column, metas)
        return _Tapped(DataFrame(jdf, spark), metas, through)

    def ticks_channel(self) -> TicksChannel:
        """The helper's ``TicksSource``."""
        return _Ticks(self.helper.ticks_source())

    def metrics_channel(self) -> MetricsChannel:
        """The helper's ``QueryMetrics``."""
        return _Metrics(self.helper.query_metrics())


class _Tapped:
    """A stage tapped by ``WriteThrough`` and the accumulator of its metadata rows."""

    def __init__(self, frame: DataFrame, accumulator: Any, through: Any) -> None:
        self._frame = frame
        self._accumulator = accumulator
        self._through = through

    @property
    def frame(self) -> DataFrame:
        """The stage's rows for the sink (header and metadata rows dropped by the JVM)."""
        return self._frame

    def metadata(self) -> list[str]:
        """The metadata rows of the successful tasks (``WriteThrough.metadataJson``: one py4j call)."""
        texts = json.loads(str(self._through.metadataJson(self._accumulator)))
        return [str(text) for text in texts]


class _Ticks:
    """``TicksSource``'s static methods (``java/TicksSource.java``)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def request(self, token: str, batch_id: int) -> None:
        """``TicksSource.request``."""
        self._source.request(token, batch_id)

    def publish(self, token: str, keys: list[str], values: list[str]) -> None:
        """``TicksSource.publish`` (as ``publishJson``: one py4j call)."""
        self._source.publishJson(token, json.dumps(dict(zip(keys, values, strict=True))))

    def release(self, token: str) -> None:
        """``TicksSource.release``."""
        self._source.release(token)


class _Metrics:
    """``QueryMetrics``'s static methods (``java/QueryMetrics.java``)."""

    def __init__(self, metrics: Any) -> None:
        self._metrics = metrics

    def update(self, name: str, names: list[str], values: list[float]) -> None:
        """``QueryMetrics.update`` (as ``updateJson``: one py4j call)."""
        self._metrics.updateJson(name, json.dumps(dict(zip(names, values, strict=True))))

    def remove(self, name: str) -> None:
        """``QueryMetrics.remove``."""
        self._metrics.remove(name)


def _leaf(node: Any) -> SourceLeaf:
    """A plan leaf with what blobstate reads of a streaming source (options, format, schema)."""
    kind = str(node.getClass().getSimpleName())
    if kind == STREAMING_RELATION:
        source = node.dataSource()
        schema = source.userSpecifiedSchema()
        return SourceLeaf(
            node=kind,
            format=str(source.className()),
            options=_scala_map(source.options()),
            schema_json=str(schema.get().json()) if schema.isDefined() else None,
        )
    if kind == STREAMING_RELATION_V2:
        options = {str(k): str(v) for k, v in dict(node.extraOptions().asCaseSensitiveMap()).items()}
        return SourceLeaf(node=kind, options=options)
    return SourceLeaf(node=kind)


def _scala_map(m: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    it = m.iterator()
    while it.hasNext():
        pair = it.next()
        out[str(pair._1())] = str(pair._2())
    return out


def _field(java_object: Any, name: str) -> int:
    """A public field of a JVM object (py4j reaches fields only through ``get_field``)."""
    from py4j.java_gateway import get_field

    return int(get_field(java_object, name))
