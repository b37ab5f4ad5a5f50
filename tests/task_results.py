"""A task result as a task of the processing stage reports one, for tests without Spark."""

from __future__ import annotations

from blobstate.batch.contracts import TaskResult


def a_result(**changes: object) -> TaskResult:
    values: dict[str, object] = {
        "partition": 3,
        "version": 8,
        "uid": "u" * 32,
        "executor_id": "1",
        "host": "10.0.0.2",
        "attempt": 0,
        "stage_id": 12,
        "objects_written": ("0/3/8_x.delta",),
        "objects": {"delta": {"size": 10, "sha256": "ab" * 32}, "snapshot": None},
        "snapshot_repairs": (),
        "bytes_uploaded": 10,
        "changelog_bytes": 10,
        "snapshot": False,
        "snapshot_upload": {"mode": "background", "in_flight": [], "failed": []},
        "load_seconds": 0.01,
        "started_at": 1_700_000_000.5,
        "opened_at": 1_700_000_000.6,
        "restore_bytes": 0,
        "snapshot_restore_bytes": 0,
        "load_rule": "1",
        "task_seconds": 0.2,
        "max_event_time_ms": None,
        "input_rows": 5,
        "output_rows": 2,
        "state_keys": 4,
        "commit_seconds": 0.05,
        "process_seconds": 0.1,
    }
    values.update(changes)
    return TaskResult(**values)  # type: ignore[arg-type]
