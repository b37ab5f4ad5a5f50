"""Differential testing of blobstate against Spark's own ``transformWithStateInPandas``.

A seeded generator (:func:`generate_job`) draws a job: one or two grouping key columns and a state value
column of Spark SQL types (every integer width, float and double with -0.0, NaN and infinities, DECIMAL
of every precision up to 38 at boundary values, strings with NUL and non-BMP characters, binary, boolean,
date, TIMESTAMP, TIMESTAMP_NTZ, structs; nulls), a session time zone for the first run and another for
the restart (UTC, zones with daylight saving and with non-hour offsets), partition counts M and N, and
three micro-batches of rows drawn from a small pool of keys so that keys repeat across batches.

:func:`run_job` runs the job's processor (:class:`DiffProcessor`: value state and list state of the
value's type) twice: under Spark's own operator (RocksDB provider, ``spark.sql.shuffle.partitions`` M,
batches 0-1 in the first zone, batch 2 after a restart in the second) and under blobstate (M partitions,
batches 0-1 in the first zone, a rescale to N, batch 2 after a restart in the second zone). Then it
compares:

- the output rows of every batch (as sorted, zone-independent values);
- the state: Spark's state reader (``format("statestore")``) against ``blobstate.read_state``, both
  read in the second zone, as (key, value) rows;
- blobstate's partition of every key against ``pmod(hash(key columns), N)`` computed by Spark.

It returns a :class:`Verdict` listing every disagreement.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

SPARK_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
ZONES = [
    "UTC",
    "America/Los_Angeles",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
]
"""Session time zones: UTC, zones with daylight saving, a half-hour and a 45-minute offset (Lord Howe
shifts by half an hour)."""
_EXACT = Context(prec=80)
UTC = dt.UTC


# ---------------------------------------------------------------------------------------------- types
def _decimal_type(rnd: random.Random) -> DecimalType:
    p = rnd.choice([1, 2, 9, 10, 18, 19, 20, 28, 29, 37, 38, rnd.randint(1, 38)])
    return DecimalType(p, rnd.choice(sorted({0, p // 2, p})))


def random_type(rnd: random.Random, depth: int = 0) -> DataType:
    """A Spark SQL type a grouping key and a state value can have."""
    atomic: list[Any] = [
        ByteType,
        ShortType,
        IntegerType,
        LongType,
        FloatType,
        DoubleType,
        StringType,
        BinaryType,
        BooleanType,
        DateType,
        TimestampType,
        TimestampType,
        TimestampNTZType,
        None,  # decimal
        None,
    ]
    if depth == 0:
        atomic.append("struct")
    choice = rnd.choice(atomic)
    if choice is None:
        return _decimal_type(rnd)
    if choice == "struct":
        return StructType(
            [StructField(f"f{i}", random_type(rnd, depth + 1)) for i in range(rnd.randint(1, 2))]
        )
    dtype: DataType = choice()
    return dtype


def _boundary_instants() -> list[dt.datetime]:
    return [
        dt.datetime(1970, 1, 1, tzinfo=UTC),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(2026, 11, 1, 8, 30, tzinfo=UTC),  # 01:30 PDT
        dt.datetime(2026, 11, 1, 9, 30, tzinfo=UTC),  # 01:30 PST: reads alike in Los Angeles
        dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # inside Berlin's skipped hour
        dt.datetime(1900, 1, 1, 0, 0, 1, tzinfo=UTC),
        dt.datetime(2037, 6, 1, 12, 0, tzinfo=UTC),
    ]


def random_value(rnd: random.Random, dtype: DataType, nullable: bool = True) -> Any:
    """A value of ``dtype``: boundary values often, random ones otherwise, null sometimes."""
    if nullable and rnd.random() < 0.08:
        return None
    edge = rnd.random() < 0.5
    if isinstance(dtype, (ByteType, ShortType, IntegerType, LongType)):
        bits = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}[type(dtype)]
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return rnd.choice([lo, hi, 0, -1, 1, lo + 1]) if edge else rnd.randint(lo, hi)
    if isinstance(dtype, (FloatType, DoubleType)):
        specials = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, -2.25]
        return rnd.choice(specials) if edge else float(rnd.randint(-1000, 1000)) / 8
    if isinstance(dtype, DecimalType):
        top = 10**dtype.precision - 1
        choices = [0, 1, -1, top, -top]
        for k in range(1, 17):
            if 2 ** (8 * k - 1) <= top:
                choices += [2 ** (8 * k - 1), -(2 ** (8 * k - 1)), 2 ** (8 * k - 1) - 1]
        unscaled = rnd.choice(choices) if edge else rnd.randint(-top, top)
        return Decimal(unscaled).scaleb(-dtype.scale, context=_EXACT)
    if isinstance(dtype, StringType):
        alphabet = ["a", "b", "\x00", "\u00e9", "\U0001f600", "\u4e2d", " "]
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 4)))
    if isinstance(dtype, BinaryType):
        return bytes(rnd.choice([0, 1, 255, 128]) for _ in range(rnd.randint(0, 4)))
    if isinstance(dtype, BooleanType):
        return rnd.random() < 0.5
    if isinstance(dtype, DateType):
        return (
            rnd.choice([dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(2000, 2, 29)])
            if edge
            else (dt.date(1970, 1, 1) + dt.timedelta(days=rnd.randint(-20000, 60000)))
        )
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        t = (
            rnd.choice(_boundary_instants())
            if edge
            # within 1902-2037, where every zone's rules are known to Python's and Java's zone data alike
            else (dt.datetime(2000, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=rnd.randint(-(2**30), 2**30)))
        )
        return t if isinstance(dtype, TimestampType) else t.replace(tzinfo=None)
    if isinstance(dtype, StructType):
        return tuple(random_value(rnd, f.dataType) for f in dtype.fields)
    raise TypeError(f"no generator for {dtype.simpleString()}")


# ---------------------------------------------------------------------------------------------- jobs
@dataclass
class Job:
    """One generated job."""

    seed: int
    key_types: list[DataType]
    value_type: DataType
    first_zone: str
    second_zone: str
    m: int
    n: int
    batches: list[list[tuple[Any, ...]]]
    """Rows ``(*key values, seq, value)`` per batch."""

    @property
    def input_schema(self) -> StructType:
        """The input's columns."""
        keys = [StructField(f"k{i}", t) for i, t in enumerate(self.key_types)]
        return StructType([*keys, StructField("seq", LongType()), StructField("v", self.value_type)])

    @property
    def key_names(self) -> list[str]:
        """The grouping columns."""
        return [f"k{i}" for i in range(len(self.key_types))]

    @property
    def output_schema(self) -> StructType:
        """The processor's output."""
        keys = [StructField(f"k{i}", t) for i, t in enumerate(self.key_types)]
        return StructType(
            [
                *keys,
                StructField("count", LongType()),
                StructField("last", self.value_type),
                StructField("kept", LongType()),
            ]
        )

    def describe(self) -> str:
        """A line naming the job."""
        keys = ", ".join(t.simpleString() for t in self.key_types)
        return (
            f"seed {self.seed}: key ({keys}), value {self.value_type.simpleString()}, zones "
            f"{self.first_zone} -> {self.second_zone}, partitions {self.m} -> {self.n}"
        )


def generate_job(seed: int) -> Job:
    """The job of ``seed`` (the same seed gives the same job)."""
    rnd = random.Random(seed)
    key_types = [random_type(rnd) for _ in range(rnd.choice([1, 1, 2]))]
    value_type = random_type(rnd)
    # No null key values: Spark's own transformWithStateInPandas turns a null INT key into INT_MIN's
    # state, fails on a null DATE key and splits a null DOUBLE key into a group per row (pandas' NaN);
    # blobstate keeps a null as one key of its own (README, "Differences from Spark's own operators").
    pool = [tuple(random_value(rnd, t, nullable=False) for t in key_types) for _ in range(rnd.randint(3, 12))]
    seq = 0
    batches = []
    for _ in range(3):
        rows = []
        for _ in range(rnd.randint(1, 14)):
            seq += 1
            # An integer value column with a null becomes float64 in pandas (under Spark too), which loses
            # integers beyond 2^53: such columns get no nulls.
            integral = isinstance(value_type, (ByteType, ShortType, IntegerType, LongType))
            rows.append((*rnd.choice(pool), seq, random_value(rnd, value_type, nullable=not integral)))
        batches.append(rows)
    zones = rnd.sample(ZONES, 2)
    # A TIMESTAMP *value* of the repeated hour reaches the processor as an ambiguous naive time, which
    # PySpark's own pandas-to-Arrow conversion of a struct refuses (under Spark too): such values are
    # null. Keys keep them: that the two instants stay two keys is what the tests are for.
    # The same holds for a TIMESTAMP inside a struct key that a processor copies into its output; a
    # top-level TIMESTAMP key keeps its repeated-hour instants.
    arity = len(key_types)

    def nested(value: Any, dtype: DataType) -> Any:
        return _unambiguous(value, dtype, zones) if isinstance(dtype, StructType) else value

    batches = [
        [
            (
                *(nested(v, t) for v, t in zip(row[:arity], key_types, strict=True)),
                *row[arity:-1],
                _unambiguous(row[-1], value_type, zones),
            )
            for row in rows
        ]
        for rows in batches
    ]
    return Job(seed, key_types, value_type, zones[0], zones[1], rnd.randint(1, 3), rnd.randint(1, 4), batches)


def _unambiguous(value: Any, dtype: DataType, zones: Sequence[str]) -> Any:
    if value is None:
        return None
    if isinstance(dtype, StructType):
        return tuple(_unambiguous(v, f.dataType, zones) for v, f in zip(value, dtype.fields, strict=True))
    if isinstance(dtype, TimestampType) and any(reads_ambiguously(value, dtype, z) for z in zones):
        return None
    return value


class DiffProcessor(StatefulProcessor):
    """Per key: ``agg`` (value state: the row count and the value of the row with the largest ``seq``)
    and ``kept`` (list state: the last three values by ``seq``); emits the key, the count, that value and
    the list's length. Plain PySpark classes: the same object runs under Spark and under blobstate."""

    def __init__(self, value_ddl: str) -> None:
        self.value_ddl = value_ddl

    def _plain(self, value: Any) -> Any:
        """A value of the input column as a careful processor writes it: pandas' missing values as None,
        and an integer column's values (floats in pandas once the column has a null) as ints."""
        if value is None or (not isinstance(value, (tuple, list, dict, bytes)) and pd.isna(value)):
            return None
        if self.value_ddl in ("tinyint", "smallint", "int", "bigint") and isinstance(value, float):
            return int(value)
        return value

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state."""
        self.agg = handle.getValueState("agg", f"count BIGINT, last {self.value_ddl}")
        self.kept = handle.getListState("kept", f"v {self.value_ddl}")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Fold the batch's rows into the state and emit one row."""
        frames = [f for f in rows]
        frame = pd.concat(frames) if len(frames) > 1 else frames[0]
        frame = frame.sort_values("seq", kind="stable")
        old = self.agg.get()
        count = (0 if old is None else int(old[0])) + len(frame)
        values = [self._plain(v) for v in frame["v"].tolist()]
        last = values[-1]
        self.agg.update((count, last))
        kept = [tuple(r) for r in self.kept.get()] if self.kept.exists() else []
        kept += [(v,) for v in values]
        kept = kept[-3:]
        self.kept.put(kept)
        out = {f"k{i}": [k] for i, k in enumerate(key)}
        out.update(count=[count], last=[last], kept=[len(kept)])
        yield pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------- running
def write_batches(job: Job, directory: Path, upto: int) -> None:
    """Write the job's first ``upto`` batches as parquet files (one per micro-batch, in order)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(job.input_schema, timezone="UTC")
    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 3600
    for i, rows in enumerate(job.batches[:upto]):
        path = directory / f"batch-{i:05d}.parquet"
        if path.exists():
            continue
        columns = list(zip(*rows, strict=True))
        arrays = [
            _arrow_column(list(c), f.dataType, a.type)
            for c, f, a in zip(columns, job.input_schema.fields, schema, strict=True)
        ]
        tmp = directory / f".batch-{i:05d}.parquet.tmp"
        pq.write_table(pa.table(arrays, schema=schema), tmp)
        import os

        os.utime(tmp, (base + i, base + i))
        os.replace(tmp, path)


def _arrow_column(values: list[Any], dtype: DataType, arrow_type: pa.DataType) -> pa.Array:
    def plain(v: Any, t: DataType) -> Any:
        if v is None:
            return None
        if isinstance(t, StructType):
            return {f.name: plain(x, f.dataType) for x, f in zip(v, t.fields, strict=True)}
        return v

    return pa.array([plain(v, dtype) for v in values], type=arrow_type)


def normalize(value: Any) -> Any:
    """A collected value in a form that compares across runs: floats by their bits' meaning (NaN equal),
    datetimes as given (collected in the driver's zone either way), rows as tuples."""
    if isinstance(value, float):
        if math.isnan(value):
            return ("nan",)
        return ("float", value, math.copysign(1.0, value))
    if isinstance(value, (tuple, list)):
        return tuple(normalize(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, normalize(v)) for k, v in value.items()))
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def order(value: Any) -> str:
    """The sort key of rows to compare: their repr, with every DECIMAL in one form (Spark collects
    0.0000000001 of a DECIMAL(10,10) as ``Decimal('1.00E-10')``, equal to the model's ``Decimal('1E-10')``
    but of another repr, which would sort the two lists differently)."""

    def canonical(v: Any) -> Any:
        if isinstance(v, Decimal):
            return ("decimal", str(v.normalize()) if v.is_finite() else str(v))
        if isinstance(v, (tuple, list)):
            return tuple(canonical(x) for x in v)
        return v

    return repr(canonical(value))


def _sorted(rows: Sequence[Any]) -> list[Any]:
    return sorted((normalize(tuple(r)) for r in rows), key=order)


@dataclass
class Verdict:
    """What a job's two runs disagreed on (empty: nothing)."""

    job: Job
    disagreements: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the runs agreed on everything compared."""
        return not self.disagreements


class _Recorder:
    def __init__(self) -> None:
        self.rows: dict[int, list[Any]] = {}

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.rows[batch_id] = _sorted(frame.collect())


def _conf(spark: Any, settings: dict[str, str]) -> Any:
    from contextlib import contextmanager

    @contextmanager
    def scope() -> Iterator[None]:
        previous = {k: spark.conf.get(k, None) for k in settings}
        for k, v in settings.items():
            spark.conf.set(k, v)
        try:
            yield
        finally:
            for k, v in previous.items():
                if v is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, v)

    return scope()


def _stream(spark: Any, job: Job, directory: Path) -> Any:
    return spark.readStream.schema(job.input_schema).option("maxFilesPerTrigger", 1).parquet(str(directory))


def run_spark(spark: Any, job: Job, root: Path) -> dict[int, list[Any]]:
    """Spark's own operator over the job: batches 0-1 in the first zone, batch 2 in the second."""
    recorder = _Recorder()
    for zone, upto in ((job.first_zone, 2), (job.second_zone, 3)):
        write_batches(job, root / "in", upto)
        settings = {
            "spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB_PROVIDER,
            "spark.sql.shuffle.partitions": str(job.m),
            "spark.sql.session.timeZone": zone,
        }
        with _conf(spark, settings):
            query = (
                _stream(spark, job, root / "in")
                .groupBy(*job.key_names)
                .transformWithStateInPandas(
                    statefulProcessor=DiffProcessor(job.value_type.simpleString()),
                    outputStructType=job.output_schema,
                    outputMode="Update",
                    timeMode="None",
                )
                .writeStream.outputMode("update")
                .foreachBatch(recorder)
                .option("checkpointLocation", str(root / "spark-ckpt"))
                .start()
            )
            try:
                query.processAllAvailable()
            finally:
                query.stop()
    return recorder.rows


def run_blobstate(spark: Any, job: Job, root: Path) -> dict[int, list[Any]]:
    """blobstate over the job: batches 0-1 on M partitions in the first zone, a rescale to N, batch 2
    after a restart in the second zone."""
    import blobstate
    from blobstate.rescale import rescale_checkpoint

    recorder = _Recorder()
    checkpoint = str(root / "ckpt")
    for zone, upto in ((job.first_zone, 2), (job.second_zone, 3)):
        write_batches(job, root / "in", upto)
        if upto == 3:
            rescale_checkpoint(spark, checkpoint, job.n)
        with _conf(spark, {"spark.sql.session.timeZone": zone}):
            query = blobstate.transform_with_state(
                _stream(spark, job, root / "in"),
                key=job.key_names,
                processor=DiffProcessor(job.value_type.simpleString()),
                output_schema=job.output_schema,
                checkpoint=checkpoint,
                sink=recorder,
                num_partitions=job.m if upto == 2 else job.n,
                local_dir=str(root / "local"),
                async_cleanup=False,
                restart_executor_wait_seconds=0.0,
            )
            try:
                query.processAllAvailable()
            finally:
                query.stop()
    return recorder.rows


def read_blobstate_state(spark: Any, job: Job, root: Path) -> tuple[list[Any], list[str]]:
    """blobstate's ``agg`` and ``kept`` state as sorted (variable, key, value) rows, read in the second
    zone, and the keys it holds in another partition than Spark's ``pmod(hash(key columns), N)``."""
    from pyspark.sql import functions as F

    import blobstate

    rows: list[Any] = []
    misplaced: list[str] = []
    with _conf(spark, {"spark.sql.session.timeZone": job.second_zone}):
        for var, column in (("agg", "value"), ("kept", "list_element")):
            frame = blobstate.read_state(spark, str(root / "ckpt"), state_var=var)
            rows += [(var, *r) for r in _sorted(frame.select("key", column).collect())]
            keys = [F.col(f"key.{k}") for k in job.key_names]
            wrong = frame.where(F.pmod(F.hash(*keys), F.lit(job.n)) != F.col("partition_id")).collect()
            misplaced += [f"{var}: {r['key']} in partition {r['partition_id']}" for r in wrong]
    return sorted(rows, key=order), misplaced


def read_spark_state(spark: Any, job: Job, root: Path) -> list[Any]:
    """Spark's ``agg`` and ``kept`` state (its state reader) as :func:`read_blobstate_state` gives ours."""
    rows: list[Any] = []
    with _conf(spark, {"spark.sql.session.timeZone": job.second_zone}):
        for var, column in (("agg", "value"), ("kept", "list_element")):
            frame = spark.read.format("statestore").option("stateVarName", var).load(str(root / "spark-ckpt"))
            rows += [(var, *r) for r in _sorted(frame.select("key", column).collect())]
    return sorted(rows, key=order)


def contains_timestamp(dtype: DataType) -> bool:
    """Whether ``dtype`` is or holds a TIMESTAMP (an instant)."""
    if isinstance(dtype, TimestampType):
        return True
    if isinstance(dtype, StructType):
        return any(contains_timestamp(f.dataType) for f in dtype.fields)
    return False


def reads_ambiguously(value: Any, dtype: DataType, zone: str) -> bool:
    """Whether a key component of ``dtype`` holds an instant whose wall-clock reading in ``zone`` is
    ambiguous (the repeated hour when clocks go back) or that a pandas processor cannot hand back exactly."""
    if value is None:
        return False
    if isinstance(dtype, StructType):
        return any(reads_ambiguously(v, f.dataType, zone) for v, f in zip(value, dtype.fields, strict=True))
    if not isinstance(dtype, TimestampType):
        return False
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")
    wall = ts.tz_convert(zone).tz_localize(None)
    try:
        back = wall.tz_localize(zone, ambiguous="raise", nonexistent="raise")
    except Exception:  # pytz/zoneinfo ambiguity or a skipped time
        return True
    return bool(back != ts)


def spark_splits(value: Any, dtype: DataType) -> bool:
    """Whether a float key component is one Spark's pandas operator groups wrongly: NaN (pandas' NaN is
    unequal to itself, so its Python worker makes a group of every row; a NaN copied into an output is
    null) or a zero (-0.0 and 0.0 meet in the Python worker's grouping only when adjacent)."""
    if isinstance(dtype, StructType):
        items = value.values() if isinstance(value, dict) else value
        return value is not None and any(
            spark_splits(v, f.dataType) for v, f in zip(items, dtype.fields, strict=True)
        )
    if not isinstance(dtype, (FloatType, DoubleType)):
        return False
    return value is None or math.isnan(value) or value == 0.0


def _instant_key(value: Any, dtype: DataType) -> Any:
    """A key component as the reference model and the comparison identify it: an instant as epoch
    microseconds, -0.0 as 0.0, NaN as one value, a struct as a tuple."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        items = value.values() if isinstance(value, dict) else value
        return tuple(_instant_key(v, f.dataType) for v, f in zip(items, dtype.fields, strict=True))
    if isinstance(dtype, TimestampType):
        ts = pd.Timestamp(value)
        ts = ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")
        return int(ts.value // 1000)
    if isinstance(dtype, TimestampNTZType):
        return int(pd.Timestamp(value).value // 1000)
    if isinstance(dtype, (FloatType, DoubleType)):
        return "nan" if math.isnan(value) else float(value) + 0.0
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def reference(job: Job) -> tuple[dict[int, list[Any]], dict[Any, tuple[int, int]]]:
    """The plain-Python model of :class:`DiffProcessor` over the job: each batch's ``(key, count, kept)``
    rows and the final ``{key: (count, kept)}``, keys identified as instants and values."""
    count: dict[Any, int] = {}
    kept: dict[Any, int] = {}
    out: dict[int, list[Any]] = {}
    arity = len(job.key_types)
    for b, rows in enumerate(job.batches):
        touched = set()
        for row in rows:
            key = tuple(_instant_key(v, t) for v, t in zip(row[:arity], job.key_types, strict=True))
            count[key] = count.get(key, 0) + 1
            kept[key] = min(3, kept.get(key, 0) + 1)
            touched.add(key)
        out[b] = sorted(([*k, count[k], kept[k]] for k in touched), key=order)
    return out, {k: (count[k], kept[k]) for k in count}


def _blur(rows: list[Any], job: Job, zone: str) -> list[Any]:
    """``rows`` (summaries: key components as identified by :func:`_instant_key`, then counts) with every
    TIMESTAMP component that reads ambiguously in ``zone`` replaced by that reading."""
    arity = len(job.key_types)
    out = []
    for row in rows:
        key = list(row[:arity])
        for i, t in enumerate(job.key_types):
            if isinstance(t, TimestampType) and key[i] is not None:
                instant = pd.Timestamp(key[i], unit="us", tz="UTC")
                if reads_ambiguously(instant, t, zone):
                    key[i] = ("reads", str(instant.tz_convert(zone).tz_localize(None)))
        out.append([*key, *row[arity:]])
    return sorted(out, key=order)


def _output_summary(job: Job, rows: list[Any]) -> list[Any]:
    arity = len(job.key_types)
    summary = []
    for row in rows:
        # A NaN key copied into a pandas output row becomes null on its way to Arrow (as under Spark);
        # the generator draws no null keys, so a null float key in an output is that NaN.
        key = [_output_key(v, t) for v, t in zip(row[:arity], job.key_types, strict=True)]
        summary.append([*key, row[arity], row[arity + 2]])
    return sorted(summary, key=order)


def _nan_is_null(key: Sequence[Any], job: Job) -> list[Any]:
    """A model key as an output row shows it: a float field inside a struct that is null or NaN reads
    "nan" (both are null in a pandas output)."""

    def one(value: Any, dtype: DataType) -> Any:
        if isinstance(dtype, StructType) and value is not None:
            return tuple(one(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True))
        if isinstance(dtype, (FloatType, DoubleType)) and value is None:
            return "nan"
        return value

    return [one(v, t) for v, t in zip(key, job.key_types, strict=True)]


def _output_key(value: Any, dtype: DataType) -> Any:
    """An output row's key component as the model identifies it; a NaN that became null on its way to
    Arrow (also inside a struct) is the NaN again."""
    if value is None and isinstance(dtype, (FloatType, DoubleType)):
        return "nan"
    if value is not None and isinstance(dtype, StructType):
        return tuple(_output_key(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True))
    return _instant_key(_denormalize(value), dtype)


def _denormalize(value: Any) -> Any:
    """Undo :func:`normalize` for a float (the summary identifies keys itself)."""
    if isinstance(value, tuple) and value and value[0] == "nan":
        return math.nan
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "float":
        return value[1]
    if isinstance(value, tuple):
        return tuple(_denormalize(v) for v in value)
    return value


def run_job(spark: Any, job: Job, root: Path) -> Verdict:
    """Run ``job`` under Spark and under blobstate in ``root`` and compare (see the module docstring).

    blobstate is compared with the plain-Python :func:`reference` on everything that identifies state:
    every batch's keys (as instants), counts and list lengths, the state reader's keys and counts, and
    each key's partition. It is compared with Spark's own operator row for row, except for what Spark's
    pandas operator gets wrong by design of its conversions (README, "Differences from Spark's own
    operators"): Spark runs every batch in the first zone (after a change of zone it keys a TIMESTAMP by
    the new zone's wall clock and loses its state), rows whose key reads ambiguously in that zone are left
    out (Spark merges the two instants of a repeated hour), and a TIMESTAMP state value is compared with
    the model only (its count), not with Spark.
    """
    started = time.monotonic()
    verdict = Verdict(job)
    expected, final = reference(job)
    arity = len(job.key_types)
    ours = run_blobstate(spark, job, root / "ours")
    for b in range(len(job.batches)):
        # A key reaches the processor as a naive reading of the batch's zone; copied into an output row,
        # a reading of the repeated hour names either instant (as under Spark): compare those by reading.
        zone = job.first_zone if b < 2 else job.second_zone
        got = _blur(_output_summary(job, ours.get(b, [])), job, zone)
        want = [[*_nan_is_null(r[:arity], job), *r[arity:]] for r in expected[b]]
        if got != _blur(sorted(want, key=order), job, zone):
            verdict.disagreements.append(f"batch {b}: blobstate {got} != model {expected[b]}")
    state_ours, misplaced = read_blobstate_state(spark, job, root / "ours")
    counts = {
        tuple(_instant_key(_denormalize(v), t) for v, t in zip(key, job.key_types, strict=True)): value[0]
        for var, key, value in state_ours
        if var == "agg"
    }
    if counts != {k: c for k, (c, _) in final.items()}:
        verdict.disagreements.append(f"state counts: blobstate {counts} != model {dict(final)}")
    verdict.disagreements += [f"misplaced key {m}" for m in misplaced]

    spark_job = Job(
        job.seed, job.key_types, job.value_type, job.first_zone, job.first_zone, job.m, job.n, job.batches
    )
    theirs = run_spark(spark, spark_job, root / "spark")
    state_theirs = read_spark_state(spark, spark_job, root / "spark")

    def comparable(row: Any) -> bool:
        return not any(
            spark_splits(_denormalize(v), t) or reads_ambiguously(_denormalize(v), t, z)
            for v, t in zip(row[:arity], job.key_types, strict=True)
            for z in (job.first_zone, job.second_zone)
        )

    value_too = not contains_timestamp(job.value_type)
    for b in range(len(job.batches)):
        mine = [
            r if value_too else (*r[:arity], r[arity], r[arity + 2]) for r in ours.get(b, []) if comparable(r)
        ]
        spark_rows = [
            r if value_too else (*r[:arity], r[arity], r[arity + 2])
            for r in theirs.get(b, [])
            if comparable(r)
        ]
        if mine != spark_rows:
            verdict.disagreements.append(f"batch {b} outputs: blobstate {mine} != Spark {spark_rows}")
    if value_too:
        mine_state = [r for r in state_ours if comparable(r[1])]
        spark_state = [
            (var, _spark_key(key, job), value)
            for var, key, value in state_theirs
            if comparable(_spark_key(key, job))
        ]
        if mine_state != sorted(spark_state, key=order):
            verdict.disagreements.append(f"state: blobstate {mine_state} != Spark {spark_state}")
    verdict.seconds = time.monotonic() - started
    return verdict


def _spark_key(key: Any, job: Job) -> Any:
    """A key read by Spark's state reader, whose pandas operator stored a TIMESTAMP key as the first zone's
    wall clock read as UTC (the Python worker's zone), taken back to the instant it stands for."""

    def fix(value: Any, dtype: DataType) -> Any:
        if value is None:
            return None
        if isinstance(dtype, StructType):
            return tuple(fix(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True))
        if isinstance(dtype, TimestampType):
            wall = pd.Timestamp(value)
            return (
                wall.tz_localize(job.first_zone, ambiguous=True, nonexistent="shift_forward")
                .tz_convert("UTC")
                .tz_localize(None)
                .to_pydatetime()
            )
        return value

    return normalize(tuple(fix(_denormalize(v), t) for v, t in zip(key, job.key_types, strict=True)))
