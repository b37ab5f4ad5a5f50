"""The rescale as one Spark job in which Spark computes every key's new partition.

Stage 1, one task per old partition (``spark.range`` with one row per task, then ``mapInArrow``):
restore the partition at version ``L`` and emit each record as a row ``(fixed, op, src, cf, k, v)`` plus
its grouping key as typed columns ``c<op>_<i>`` of the key's Spark types (decoded from the stored key and,
for an earlier release's TIMESTAMP keys, converted to instants). ``$meta`` rows are emitted once per new
partition with ``fixed`` naming it.

Spark then computes each row's target ``op * N + pmod(hash(c<op>_0, ...), N)``, the expression the
query's shuffle uses, and with M > 1 old partitions flags a row whose ``pmod(hash(...), M)`` is not
the partition it was stored in (the recorded key schema does not match the stored keys: nothing is
committed). The rows are shuffled by target and sorted by it; stage 2 (``mapInArrow``) builds one new
partition per run of equal targets (:class:`~blobstate.rescale.job.PartitionBuilder`) and returns its
references as one JSON row. A target with no rows at all (an empty checkpoint) is built by the driver.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from blobstate.lineage.changelog import ChangeOp
from blobstate.rescale.keys import key_arrow_fields, key_columns
from blobstate.rescale.split import RescaleError, grouping_key, key_offset, record_blocks

if TYPE_CHECKING:
    from blobstate.rescale.job import Fault, RescalePlan

_PUT = ChangeOp.PUT
_FIXED_COLUMNS = [
    pa.field("fixed", pa.int32()),
    pa.field("op", pa.int32()),
    pa.field("src", pa.int32()),
    pa.field("cf", pa.string()),
    pa.field("k", pa.binary()),
    pa.field("v", pa.binary()),
]


def _key_prefix(op_index: int) -> str:
    return f"c{op_index}_"


def split_rows(
    plan: RescalePlan, sources: list[tuple[str, int]], fault: Fault | None, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Stage 1: the rows of the old partitions whose indexes in ``sources`` ``batches`` carry (``id``)."""
    from blobstate.blobstore import open_blob_store
    from blobstate.reader.checkpoint import open_version, restored_partition
    from blobstate.rescale.job import _open_scratch
    from blobstate.stored_schema import parse_stored_schema

    schemas = [
        parse_stored_schema(plan.key_schemas[op], where=f"key_schema of operator {op}")
        for op in plan.processors
    ]
    key_fields = [key_arrow_fields(s, _key_prefix(i)) for i, s in enumerate(schemas)]
    arrow_schema = pa.schema(_FIXED_COLUMNS + [f for fields in key_fields for f in fields])
    n = plan.new_partitions

    def rows(
        fixed: list[int | None],
        op_index: int,
        src: int,
        cf: str,
        keys: list[bytes],
        values: list[bytes],
        kcols: Any,
    ) -> pa.RecordBatch:
        count = len(keys)
        columns: list[pa.Array] = [
            pa.array(fixed, type=pa.int32()),
            pa.array([op_index] * count, type=pa.int32()),
            pa.array([src] * count, type=pa.int32()),
            pa.array([cf] * count, type=pa.string()),
            pa.array(keys, type=pa.binary()),
            pa.array(values, type=pa.binary()),
        ]
        for i, fields in enumerate(key_fields):
            if i == op_index and kcols is not None:
                columns.extend(kcols)
            else:
                columns.extend(pa.nulls(count, type=f.type) for f in fields)
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema)

    for batch in batches:
        for index in batch.column("id").to_pylist():
            op, partition = sources[index]
            op_index = plan.processors.index(op)
            form = plan.key_form(op)
            schema = schemas[op_index]
            store = open_blob_store(plan.store_url or plan.url)
            checkpoint = open_version(store, plan.version)
            where = f"operator {op} partition {partition} at version {plan.version} of {plan.url}"
            pending: pa.RecordBatch | None = None
            with restored_partition(store, checkpoint, op, partition, _open_scratch) as rocks:
                for block in record_blocks(rocks, form, where):
                    if block.grouping is None:
                        for q in range(n):
                            fixed: list[int | None] = [op_index * n + q] * len(block.keys)
                            out = rows(fixed, op_index, partition, block.cf, block.keys, block.values, None)
                            if pending is not None:
                                yield pending
                            pending = out
                        continue
                    memo: dict[bytes, Any] = {}
                    decoded = []
                    for kb in block.grouping:
                        key = memo.get(kb)
                        if key is None:
                            key = memo[kb] = _decode(kb, form.arity)  # already converted by record_blocks
                        decoded.append(key)
                    try:
                        kcols = key_columns(decoded, schema, key_fields[op_index])
                    except (
                        pa.ArrowInvalid,
                        pa.ArrowTypeError,
                        TypeError,
                        ValueError,
                        OverflowError,
                    ) as error:
                        raise RescaleError(
                            f"{where}: a grouping key does not fit the key schema {schema.simpleString()} "
                            f"recorded in metadata.json ({error}); nothing was committed"
                        ) from None
                    out = rows(
                        [None] * len(block.keys),
                        op_index,
                        partition,
                        block.cf,
                        block.keys,
                        block.values,
                        kcols,
                    )
                    if pending is not None:
                        yield pending
                    pending = out
            if fault is not None:
                fault(f"split:{op}/{partition}")
            if pending is not None:
                yield pending


def _decode(kb: bytes, arity: int) -> Any:
    from blobstate.encoding.codec import decode_key

    return decode_key(kb, arity)[0]


def build_rows(
    plan: RescalePlan, fault: Fault | None, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Stage 2: one JSON row per new partition built from the runs of equal ``t`` in ``batches``."""
    from blobstate.rescale.job import PartitionBuilder

    n = plan.new_partitions
    builder: PartitionBuilder | None = None
    current = -1

    def done(b: PartitionBuilder) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([pa.array([json.dumps(b.finish(fault))])], names=["result"])

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            targets = batch.column("t").to_pylist()
            bad = batch.column("misplaced").to_pylist()
            cfs = batch.column("cf").to_pylist()
            keys = batch.column("k").to_pylist()
            values = batch.column("v").to_pylist()
            start = 0
            for i in range(batch.num_rows + 1):
                if i < batch.num_rows and targets[i] == current:
                    continue
                if builder is not None and start < i:
                    _add(builder, cfs[start:i], keys[start:i], values[start:i], bad[start:i], plan)
                if i == batch.num_rows:
                    break
                if builder is not None:
                    yield done(builder)
                current = targets[i]
                builder = PartitionBuilder(plan, plan.processors[current // n], current % n)
                start = i
        if builder is not None:
            finished, builder = builder, None
            yield done(finished)
    except BaseException:
        if builder is not None:
            builder.abort()
        raise


def _add(
    builder: Any, cfs: list[str], keys: list[bytes], values: list[bytes], bad: list[bool], plan: Any
) -> None:
    """Rows of one new partition, in runs of one column family, into its builder."""
    from blobstate.encoding.codec import decode_key
    from blobstate.encoding.layout import META_CF

    if any(bad):
        i = bad.index(True)
        arity = plan.key_form(builder.op).arity
        key = decode_key(grouping_key(cfs[i], keys[i], arity), arity)[0]
        raise RescaleError(
            f"{builder.where}: the grouping key {key!r} is stored in a partition other than the one Spark's "
            f"hash puts it in under {plan.old_partitions} partitions: the key schema recorded in "
            "metadata.json does not match the stored keys; nothing was committed"
        )
    start = 0
    for i in range(1, len(cfs) + 1):
        if i < len(cfs) and cfs[i] == cfs[start]:
            continue
        cf = cfs[start]
        if cf == META_CF:
            for k, v in zip(keys[start:i], values[start:i], strict=True):
                builder.add_meta(k, v)
        else:
            key_offset(cf)  # a column family the rescale knows
            builder.add((_PUT, cf, k, v) for k, v in zip(keys[start:i], values[start:i], strict=True))
        start = i


def build_with_spark(spark: Any, plan: RescalePlan, fault: Fault | None, url: str) -> list[dict[str, Any]]:
    """Both stages as one Spark job; each new partition's references (see the module docstring)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, BooleanType, IntegerType, StringType, StructField, StructType

    from blobstate.stored_schema import parse_stored_schema

    n, m, processors = plan.new_partitions, plan.old_partitions, plan.processors
    sources = [(op, p) for op in processors for p in range(m)]
    targets = len(processors) * n
    fields = [
        StructField("fixed", IntegerType()),
        StructField("op", IntegerType()),
        StructField("src", IntegerType()),
        StructField("cf", StringType()),
        StructField("k", BinaryType()),
        StructField("v", BinaryType()),
    ]
    key_cols: list[list[str]] = []
    for i, op in enumerate(processors):
        schema = parse_stored_schema(plan.key_schemas[op], where=f"key_schema of operator {op}")
        names = [f"{_key_prefix(i)}{j}" for j in range(len(schema.fields))]
        key_cols.append(names)
        fields += [StructField(name, f.dataType) for name, f in zip(names, schema.fields, strict=True)]
    split_schema = StructType(fields)
    hashed = [F.hash(*[F.col(c) for c in cols]) for cols in key_cols]
    target: Any = None
    misplaced: Any = None
    for i, h in enumerate(hashed):
        new = F.lit(i * n) + F.pmod(h, F.lit(n))
        wrong = F.pmod(h, F.lit(m)) != F.col("src") if m > 1 else F.lit(False)
        target = F.when(F.col("op") == i, new) if target is None else target.when(F.col("op") == i, new)
        misplaced = (
            F.when(F.col("op") == i, wrong) if misplaced is None else misplaced.when(F.col("op") == i, wrong)
        )
    assert target is not None and misplaced is not None
    is_meta = F.col("fixed").isNotNull()
    split: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] = lambda it: split_rows(  # noqa: E731
        plan, sources, fault, it
    )
    build: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] = lambda it: build_rows(  # noqa: E731
        plan, fault, it
    )
    with _job_description(spark, f"blobstate rescale {url} {m} -> {n}"):
        frame = (
            spark.range(len(sources), numPartitions=len(sources))
            .mapInArrow(split, split_schema)
            .select(
                F.when(is_meta, F.col("fixed")).otherwise(target).alias("t"),
                F.when(is_meta, F.lit(False)).otherwise(misplaced).cast(BooleanType()).alias("misplaced"),
                "cf",
                "k",
                "v",
            )
            .repartition(targets, "t")
            .sortWithinPartitions("t")
            .mapInArrow(build, StructType([StructField("result", StringType())]))
        )
        rows = [json.loads(r["result"]) for r in frame.collect()]
    built = {(r["op"], int(r["partition"])) for r in rows}
    if len(built) != len(rows):
        raise RescaleError(f"rescale of {url}: a new partition was built twice")
    from blobstate.rescale.job import PartitionBuilder

    for t in range(targets):  # no row at all reached it: an empty checkpoint
        op, q = processors[t // n], t % n
        if (op, q) not in built:
            rows.append(PartitionBuilder(plan, op, q).finish(fault))
    return rows


@contextlib.contextmanager
def _job_description(spark: Any, text: str) -> Iterator[None]:
    """``text`` as the description of the Spark jobs run inside the block, on a classic session (a Spark
    Connect session has no SparkContext: its jobs go without one)."""
    from blobstate.batch.jvm import is_connect

    if is_connect(spark):
        yield
        return
    sc = spark.sparkContext
    sc.setJobDescription(text)
    try:
        yield
    finally:
        sc.setJobDescription(None)


__all__ = ["build_rows", "build_with_spark", "split_rows"]
