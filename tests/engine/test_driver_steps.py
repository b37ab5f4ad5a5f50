"""The driver sequences a batch: prepare, stage and sink, commit, after-commit, report (no Spark).

The stage is replaced by one that records what it was given and answers with tasks' results; the
commit log is a real in-memory blob store.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace

import pyarrow as pa
import pytest

from blobstate.batch.contracts import PartitionSpec, TaskResult
from blobstate.batch.steps import CommitPart, PreparedBatch
from blobstate.blobstore import open_blob_store
from blobstate.engine.config import QueryConfig
from blobstate.engine.driver import BatchDriver, PostCommit, QueryTasks
from blobstate.engine.outputs import StageResult
from blobstate.engine.stage import ProcessorFailedError, StageRun
from blobstate.engine.task import TaskSpec
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from task_results import a_result

OUTPUT = pa.schema([pa.field("key", pa.string())])


class RecordingStep:
    """A step that records each call in the shared ``calls`` list and leaves a mark on the batch."""

    def __init__(self, name: str, calls: list[str], log: CommitLog) -> None:
        self.name, self.calls, self.log = name, calls, log

    def prepare(self, batch: PreparedBatch) -> None:
        self.calls.append(f"{self.name}.prepare")
        batch.plan = replace(batch.plan, inline_output_bytes=batch.plan.inline_output_bytes + 1)

    def contribute(self, batch: PreparedBatch, results: Mapping[int, TaskResult]) -> CommitPart:
        self.calls.append(f"{self.name}.contribute")
        return CommitPart(metrics={self.name: sorted(results)})

    def after_commit(self, commit: Commit, results: Mapping[int, TaskResult]) -> None:
        assert self.log.commit_exists(commit.version), "after_commit runs once the commit is written"
        self.calls.append(f"{self.name}.after_commit")

    def wants_another_batch(self) -> bool:
        return False

    def stop(self) -> None:
        self.calls.append(f"{self.name}.stop")


class RecordingStage:
    """Stands for the processing stage: records the spec it ran, answers with one result per partition."""

    writes_through = False
    initial_state = None

    def __init__(self, calls: list[str], fail: bool = False) -> None:
        self.calls, self.fail = calls, fail
        self.failure: ProcessorFailedError | None = None
        self.specs: list[TaskSpec] = []

    def recovery_seconds(self, result: StageResult) -> float:
        return 0.0

    def run(self, frame: object, spec: TaskSpec, placement: object) -> StageRun:
        self.calls.append("stage")
        self.specs.append(spec)
        if self.fail:
            self.failure = ProcessorFailedError("batch 0: a task of the processing stage failed: boom")
            raise self.failure
        version = spec.plan.committing
        results = {p: a_result(partition=p, version=version, uid=uuid.uuid4().hex) for p in (0, 1)}
        return StageRun(StageResult(results, frame=None), 0.0, 1)  # type: ignore[arg-type]


def make_driver(
    calls: list[str], fail: bool = False, config: QueryConfig | None = None, initial_watermark_ms: int = 0
) -> tuple[BatchDriver, RecordingStage]:
    store = open_blob_store(f"memory://{uuid.uuid4().hex}")
    log = CommitLog(store)
    log.write_metadata(QueryMetadata.new(2, {"0": {"key_columns": ["key"]}}))
    post = PostCommit(log, in_background=False)
    post.steps = [("record", lambda commit: calls.append(f"post-commit {commit.version}"))]
    stage = RecordingStage(calls, fail)
    driver = BatchDriver(
        config=config or QueryConfig(async_cleanup=False),
        tasks=QueryTasks(PartitionSpec(store.url, "q", "0", 2), object(), OUTPUT, ("key",)),
        stage=stage,  # type: ignore[arg-type]
        post_commit=post,
        writer_id="w",
        steps=[RecordingStep("a", calls, log), RecordingStep("b", calls, log)],
        on_batch=lambda report: calls.append(f"report {report.version}"),
        initial_watermark_ms=initial_watermark_ms,
    )
    return driver, stage


FRAME = SimpleNamespace(sparkSession=SimpleNamespace(conf=SimpleNamespace(get=lambda key: "UTC")))


def test_a_batch_runs_its_steps_around_the_stage_and_the_commit_in_order() -> None:
    calls: list[str] = []
    driver, stage = make_driver(calls)
    driver(FRAME, 0)  # type: ignore[arg-type]
    assert calls == [
        "a.prepare",
        "b.prepare",
        "stage",
        "a.contribute",
        "b.contribute",
        "a.after_commit",
        "b.after_commit",
        "report 1",
        "post-commit 1",
    ]
    assert stage.specs[0].plan.inline_output_bytes == QueryConfig().inline_output_bytes // 2 + 2
    commit = driver.commit_log.read_commit(1)
    assert commit.metrics is not None and (commit.metrics["a"], commit.metrics["b"]) == ([0, 1], [0, 1])
    calls.clear()
    driver(FRAME, 1)  # type: ignore[arg-type]
    assert stage.specs[1].plan.uids == commit.checkpoints["0"] and calls[-1] == "post-commit 2"
    driver.stop()
    assert calls[-2:] == ["a.stop", "b.stop"]


def test_stop_waits_for_the_last_batchs_post_commit_work_in_the_background() -> None:
    """``stop`` returns once the cleanup after the last commit has finished (it once returned at once,
    and a script that ended right after it cut the cleanup of many partitions short, each logged)."""
    calls: list[str] = []
    driver, _ = make_driver(calls)
    driver.post_commit.in_background = True
    release = threading.Event()

    def slow_cleanup(commit: object) -> None:
        release.wait(30)
        calls.append("post-commit done")

    driver.post_commit.steps = [("slow", slow_cleanup)]
    driver(FRAME, 0)  # type: ignore[arg-type]
    assert "post-commit done" not in calls  # still running in the background
    stopper = threading.Thread(target=driver.stop)
    stopper.start()
    stopper.join(0.5)
    assert stopper.is_alive() and "a.stop" not in calls  # stop waits
    release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert calls[-3:] == ["post-commit done", "a.stop", "b.stop"]


def test_the_background_post_commit_work_of_every_batch_runs_on_one_thread_that_stop_ends() -> None:
    """A query that runs for years must not start a thread per batch: glibc gives each new thread the
    next malloc arena in turn, and the large blocks a batch's cleanup now and then allocates (Python's
    interned-string table, rebuilt every few hundred batches) were left resident in one arena after
    another (the soak's driver grew about 2 MB every ~1,000 batches)."""
    calls: list[str] = []
    driver, _ = make_driver(calls)
    driver.post_commit.in_background = True
    ran_on: list[threading.Thread] = []
    driver.post_commit.steps = [("record", lambda commit: ran_on.append(threading.current_thread()))]
    for batch_id in range(5):
        driver(FRAME, batch_id)  # type: ignore[arg-type]
        driver.post_commit.wait()
        assert ran_on[-1].is_alive()  # kept for the next batch
    assert len(ran_on) == 5 and len(set(ran_on)) == 1 and ran_on[0] is not threading.current_thread()
    driver.stop()
    assert not ran_on[0].is_alive()


def test_a_cleanup_cut_short_by_the_process_ending_is_one_line_not_one_per_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A script that ends while the cleanup of many partitions runs in the background: the I/O pool is
    shut, every partition's cleanup would fail alike; one info line says so (the next run finishes it)."""
    from blobstate.state.retention import after_commit

    calls: list[str] = []
    driver, _ = make_driver(calls)
    driver(FRAME, 0)  # type: ignore[arg-type]
    commit = driver.commit_log.read_commit(1)
    store = driver.commit_log.store
    real_get = store.get

    def shut_pool(*args: object, **kwargs: object) -> object:
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    store.get = shut_pool  # type: ignore[method-assign]
    driver.post_commit.steps = [("cleanup", lambda c: after_commit(store, c, commit_log=driver.commit_log))]
    with caplog.at_level(logging.INFO, logger="blobstate"):
        driver.post_commit.start(commit)
        driver.post_commit.wait()
    store.get = real_get  # type: ignore[method-assign]
    lines = [r.getMessage() for r in caplog.records if "version 1" in r.getMessage()]
    assert lines == [
        "post-commit cleanup of version 1 stopped: the process is ending; the next run finishes it"
    ]


def test_a_replayed_batch_that_is_already_committed_runs_no_step() -> None:
    calls: list[str] = []
    driver, _ = make_driver(calls)
    driver(FRAME, 0)  # type: ignore[arg-type]
    calls.clear()
    driver(FRAME, 0)  # type: ignore[arg-type]
    assert calls == ["report 1"] and driver.reports[-1].skipped


def test_a_failed_stage_commits_nothing_and_keeps_the_failure_for_the_handle() -> None:
    calls: list[str] = []
    driver, _ = make_driver(calls, fail=True)
    with pytest.raises(ProcessorFailedError, match="boom"):
        driver(FRAME, 0)  # type: ignore[arg-type]
    assert calls == ["a.prepare", "b.prepare", "stage"]
    assert isinstance(driver.failure, ProcessorFailedError)
    assert not driver.commit_log.commit_exists(1)


EVENT_TIME = QueryConfig(async_cleanup=False, time_mode="EventTime", event_time_column="ts")


@pytest.mark.parametrize("initial", [0, 1_700_000_025_000])
def test_an_event_time_query_starts_from_its_initial_watermark_and_never_goes_below_it(initial: int) -> None:
    """A moved query's first batch fires timers and drops late rows at the old query's watermark (Spark's
    first batch: 0 for both), and the batches after it keep it while no event moves it on."""
    driver, stage = make_driver([], config=EVENT_TIME, initial_watermark_ms=initial)
    for batch_id in (0, 1):
        driver(FRAME, batch_id)  # type: ignore[arg-type]
    assert [(s.plan.run.watermark_ms, s.plan.run.late_watermark_ms) for s in stage.specs] == [
        (initial, initial),
        (initial, initial),
    ]
    assert [driver.commit_log.read_commit(v).watermark_ms for v in (1, 2)] == [initial, initial]


@pytest.mark.parametrize(
    ("value", "time_mode", "error"),
    [
        (
            1_700_000_000_000,
            "None",
            "initial_watermark_ms needs time_mode 'EventTime' (this query's is 'None')",
        ),
        (-1, "EventTime", "initial_watermark_ms must not be negative, not -1"),
        ("1700000000000", "EventTime", "initial_watermark_ms must be an int of epoch milliseconds, not '17"),
        (True, "EventTime", "initial_watermark_ms must be an int of epoch milliseconds, not True"),
    ],
)
def test_an_initial_watermark_that_cannot_work_is_refused_naming_it(
    value: object, time_mode: str, error: str
) -> None:
    from blobstate.engine.query import _check_initial_watermark
    from blobstate.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as raised:
        _check_initial_watermark(value, replace(EVENT_TIME, time_mode=time_mode))  # type: ignore[arg-type]
    assert str(raised.value).startswith(error)
    _check_initial_watermark(None, QueryConfig())
    _check_initial_watermark(0, EVENT_TIME)
