"""The pieces of an output-misfit error: the row search, the value shown, nested NOT NULL checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from processor_helpers import run, table
from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

from blobstate.processor import OutputSchemaError, StatefulProcessor
from blobstate.processor.output_errors import (
    OutputOrigins,
    find_misfit,
    forbidden_nulls,
    show,
    unexplained_error,
)


@pytest.mark.parametrize("bad", [0, 1, 500, 998, 999])
def test_find_misfit_returns_the_first_bad_row_in_few_conversions(bad: int) -> None:
    calls = []

    def fits(stop: int) -> bool:
        calls.append(stop)
        return stop <= bad

    assert find_misfit(1000, fits) == bad
    assert len(calls) <= 12  # log2(1000) + 1, not one conversion per row


def test_find_misfit_is_none_when_every_row_fits() -> None:
    assert find_misfit(10, lambda stop: True) is None


def test_origins_map_rows_to_the_handler_call_that_yielded_them() -> None:
    origins = OutputOrigins()
    origins.mark(0, "handleInputRows", ("a",))
    origins.mark(3, "handleInputRows", ("b",))
    origins.mark(4, "handleExpiredTimer", ("a",))
    assert [origins.at(r) for r in (0, 2, 3, 4, 99)] == [
        ("handleInputRows", ("a",)),
        ("handleInputRows", ("a",)),
        ("handleInputRows", ("b",)),
        ("handleExpiredTimer", ("a",)),
        ("handleExpiredTimer", ("a",)),
    ]


def test_values_are_shown_short_with_their_python_type() -> None:
    assert show("x" * 200) == "'" + "x" * 76 + "... (str)"
    assert show(np.int64(5)) == "5 (int)"
    assert show(None) == "None"
    assert show(pd.Timestamp("2024-01-01")) == "Timestamp('2024-01-01 00:00:00') (Timestamp)"


def test_forbidden_nulls_checks_declared_non_nullable_children_only_under_present_parents() -> None:
    point = pa.struct([pa.field("x", pa.int32(), nullable=False)])
    assert not forbidden_nulls(pa.array([{"x": 1}, None], point))
    assert forbidden_nulls(pa.array([{"x": 1}, {"x": None}], point))
    assert not forbidden_nulls(pa.array([{"x": None}], pa.struct([pa.field("x", pa.int32())])))

    ints = pa.list_(pa.field("element", pa.int32(), nullable=False))
    assert not forbidden_nulls(pa.array([[1], None, []], ints))
    assert forbidden_nulls(pa.array([[1], [None]], ints))
    assert not forbidden_nulls(pa.array([[1], [None]], ints).slice(0, 1))

    values = pa.map_(pa.string(), pa.field("value", pa.int32(), nullable=False))
    assert not forbidden_nulls(pa.array([[("a", 1)], None], values))
    assert forbidden_nulls(pa.array([[("a", None)]], values))

    nested = pa.list_(point)
    assert forbidden_nulls(pa.array([[{"x": None}]], nested))


class Elements(StatefulProcessor):
    """Yields an array with a null element for key ``b``."""

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        yield pd.DataFrame({"key": [key[0]], "xs": [[1, None] if key[0] == "b" else [1, 2]]})


def test_a_null_element_in_an_array_without_nulls_is_named(store: Any) -> None:
    schema = StructType(
        [StructField("key", StringType()), StructField("xs", ArrayType(IntegerType(), containsNull=False))]
    )
    with pytest.raises(OutputSchemaError) as raised:
        run(Elements(), store, table(key=["a", "b"], value=[1, 2]), output_schema=schema)
    assert str(raised.value).startswith(
        "output column 'xs' (array<int>) cannot hold [1, None] (list), yielded by handleInputRows for"
        " grouping key ('b',)"
    )


def test_an_unexplained_misfit_keeps_the_cause_without_advice_about_spark_options() -> None:
    cause = ValueError(
        "Failed to convert the value of the column 'n' with type 'str' to Arrow type 'int64'. It can be"
        " caused by overflows or other unsafe conversions warned by Arrow. Arrow safe type check can be"
        " disabled by using SQL config `spark.sql.execution.pandas.convertToArrowArraySafely`.\nmore"
    )
    schema = StructType([StructField("n", IntegerType(), nullable=False)])
    assert str(unexplained_error(schema, cause)) == (
        "output rows do not fit the output schema (n int NOT NULL): Failed to convert the value of the"
        " column 'n' with type 'str' to Arrow type 'int64'."
    )
