"""What a move carries besides a variable's rows, without Spark: the watermark after the last committed
batch, read from the files Spark 4 wrote (``spark-checkpoint/``, made by ``make_spark_checkpoint.py``)
and from a blobstate checkpoint written by the real partition and commit code; the declared state
variables of both engines; and the refusal of a move that forgets one of them, by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from checkpoints import write_checkpoint
from reader_jobs import OUTPUT, EveryState, batches

import blobstate
from blobstate.blobstore.base import LocationNotFoundError
from blobstate.reader import StateReadError
from blobstate.reader.moving import (
    BLOBSTATE,
    SPARK,
    MissingStateVariableError,
    check_moved,
    last_commit,
    parse_spark_commit,
    read_moved_state,
    spark_operator,
)
from blobstate.reader.plan import plan_every_variable

HERE = Path(__file__).resolve().parent
SPARK_CHECKPOINT = HERE / "spark-checkpoint"
EXPECTED = json.loads((HERE / "spark-checkpoint.json").read_text())
WATERMARKS = {int(batch): ms for batch, ms in EXPECTED["watermarks"].items()}


def spark_copy(tmp_path: Path) -> Path:
    """A copy of the Spark checkpoint fixture to change."""
    return Path(shutil.copytree(SPARK_CHECKPOINT, tmp_path / "spark-checkpoint"))


def one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_spark_checkpoints_watermark_is_its_newest_commits_next_batch_watermark() -> None:
    # batch 11 is Spark's batch without input after the watermark moved; commits/9 sorts last as text
    assert max(WATERMARKS) == 11 and WATERMARKS[9] < WATERMARKS[11]
    last = last_commit(str(SPARK_CHECKPOINT))
    assert (last.engine, last.batch, last.watermark_ms) == (SPARK, 11, WATERMARKS[11])
    assert blobstate.last_watermark_ms(str(SPARK_CHECKPOINT)) == WATERMARKS[11] == 1_700_000_005_000


def test_a_batch_spark_started_but_did_not_commit_does_not_count(tmp_path: Path) -> None:
    checkpoint = spark_copy(tmp_path)
    for name in ("commits/11", "commits/10", "commits/.11.crc", "commits/.10.crc"):
        (checkpoint / name).unlink()
    assert (checkpoint / "offsets" / "11").exists()  # the offsets of batches 10 and 11 stay
    assert last_commit(f"file://{checkpoint}").batch == 9
    assert blobstate.last_watermark_ms(str(checkpoint)) == WATERMARKS[9]


def test_a_spark_commit_file_that_is_not_one_is_named(tmp_path: Path) -> None:
    checkpoint = spark_copy(tmp_path)
    (checkpoint / "commits" / "11").write_text('v1\n{"nextBatchWatermarkMs":"soon"}')
    with pytest.raises(StateReadError) as error:
        blobstate.last_watermark_ms(str(checkpoint))
    assert one_line(error) == (
        f"commits/11 of {checkpoint} is not a Spark commit file: no integer nextBatchWatermarkMs"
    )
    for data, why in [
        (b"\xff\xfe", "'utf-8' codec can't decode"),
        (b"v1\n{", "Expecting property name"),
        (b'{"nextBatchWatermarkMs": 5}', "its first line is"),
        (b"v1\n" + b" " * 70_000, "70003 bytes"),
    ]:
        with pytest.raises(StateReadError, match=why):
            parse_spark_commit(data, "commits/3 of somewhere")
    assert parse_spark_commit(b'v1\n{"nextBatchWatermarkMs":12}', "x") == 12


def test_a_location_that_is_no_query_checkpoint_or_committed_nothing_is_named(tmp_path: Path) -> None:
    with pytest.raises(StateReadError) as error:
        blobstate.last_watermark_ms(str(tmp_path))
    assert one_line(error) == (
        f"{tmp_path} is not a query checkpoint: it has neither Spark's metadata file nor blobstate's"
        " metadata.json"
    )
    checkpoint = spark_copy(tmp_path)
    shutil.rmtree(checkpoint / "commits")
    with pytest.raises(StateReadError) as error:
        blobstate.last_watermark_ms(str(checkpoint))
    assert one_line(error) == f"the Spark checkpoint {checkpoint} has no committed batch (commits/ is empty)"
    with pytest.raises(LocationNotFoundError, match=f"{tmp_path / 'typo'}.* does not exist"):
        blobstate.last_watermark_ms(str(tmp_path / "typo"))


@pytest.fixture(scope="module")
def blobstate_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A blobstate checkpoint of :class:`EveryState` (value, list, map and TTL'd value state; timers)
    whose three commits record watermarks."""
    root = tmp_path_factory.mktemp("moving")
    url = str(root / "ckpt")
    write_checkpoint(
        url, batches(3, seed=7), root / "local", EveryState, OUTPUT, watermarks=[0, 9_000, 7_000]
    )
    return url


def test_a_blobstate_checkpoints_watermark_is_its_newest_commits(blobstate_checkpoint: str) -> None:
    last = last_commit(blobstate_checkpoint)
    # a commit's watermark is whatever it recorded: the engine never lets it go back
    assert (last.engine, last.batch, last.watermark_ms) == (BLOBSTATE, 3, 7_000)


def test_a_blobstate_checkpoint_without_event_time_has_watermark_zero(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    write_checkpoint(url, batches(1), tmp_path / "local", EveryState, OUTPUT)
    assert blobstate.last_watermark_ms(url) == 0


def test_every_variable_a_blobstate_checkpoint_declares_is_planned(blobstate_checkpoint: str) -> None:
    declared = plan_every_variable(blobstate_checkpoint)
    assert (declared.version, declared.operator, declared.time_mode) == (3, "0", "ProcessingTime")
    assert sorted(declared.variables) == ["buckets", "recent", "totals", "visits"]
    assert declared.variables["recent"].schema.fieldNames() == ["key", "list_element", "partition_id"]
    assert declared.timers.schema.fieldNames() == ["key", "expiration_timestamp_ms", "partition_id"]


def test_a_move_that_forgets_a_blobstate_variable_is_refused_naming_it(blobstate_checkpoint: str) -> None:
    # refused before Spark is used: no session is needed to see it
    with pytest.raises(MissingStateVariableError) as error:
        read_moved_state(None, blobstate_checkpoint, ["totals", "recent"], leave_out=["visits"])
    assert one_line(error) == (
        f"the old query's checkpoint {blobstate_checkpoint} declares state variable 'buckets', which the"
        " move does not read: add it to variables (and to the initial state), or to leave_out to drop its"
        " state on purpose"
    )
    with pytest.raises(MissingStateVariableError, match="'buckets', 'visits', which"):
        blobstate.read_moved_state(None, blobstate_checkpoint, ["totals", "recent"])


def test_the_spark_state_metadata_readers_row_gives_the_declared_variables() -> None:
    row = EXPECTED["operator"]
    operator = spark_operator([row], "the checkpoint")
    assert operator.variables == ("times", "session")  # not Spark's $eventTimers_keyToTimestamp
    assert (operator.operator_id, operator.time_mode) == (0, "EventTime")
    aggregate = {"operatorId": 1, "operatorName": "stateStoreSave", "operatorProperties": None}
    assert spark_operator([aggregate, row], "x").operator_id == 0
    with pytest.raises(StateReadError) as error:
        spark_operator([aggregate], "the old query's checkpoint /c")
    assert one_line(error) == (
        "the old query's checkpoint /c holds 0 transformWithState operators (its stateful operators:"
        " stateStoreSave (id 1)); a move reads a query with exactly one"
    )


def test_a_move_names_every_declared_variable_it_neither_reads_nor_leaves_out() -> None:
    declared = ["agg", "recent", "flags"]
    check_moved(declared, ["agg", "recent", "flags"], [], "c")
    check_moved(declared, ["agg"], ["recent", "flags"], "c")
    with pytest.raises(MissingStateVariableError) as error:
        check_moved(declared, ["agg", "recent"], [], "the old query's checkpoint /c")
    assert "declares state variable 'flags', which the move does not read" in one_line(error)
    with pytest.raises(StateReadError, match="declares no state variable 'agq'; it declares 'agg',"):
        check_moved(declared, ["agq", "recent", "flags"], [], "c")
    with pytest.raises(StateReadError, match="'flags' both moved and left out"):
        check_moved(declared, ["agg", "recent", "flags"], ["flags"], "c")
    with pytest.raises(StateReadError, match="variables must be a list of state variable names, not 'agg'"):
        check_moved(declared, "agg", [], "c")
    assert not issubclass(MissingStateVariableError, LookupError)
