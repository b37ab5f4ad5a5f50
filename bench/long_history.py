"""Requests and seconds of verify, gc --full, lineage, report, a restart's start-up and one batch, after
100 and after 2,000 commits, on the moto S3 server; prints JSON with the ratios.

Commits are made without Spark through the same path the engine's tasks and driver use: each
partition's working RocksDB store is written, committed (delta upload, a snapshot every
``--snapshot-every`` versions, uploaded inline), the commit is written through the real commit log
with the engine's ``retained_from`` and ``horizon``, and the real post-commit cleanup runs (which
prunes the commit log). Requests are counted at the S3 client (one per HTTP request sent).

Usage: PYTHONPATH=src .venv/bin/python bench/long_history.py [--commits 100 2000] [--partitions 1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blobstate.blobstore import open_blob_store
from blobstate.cli.lineage_cmds import collect_lineage
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.report.metrics import load_batch_metrics
from blobstate.state.partition import open_partition
from blobstate.state.retention import (
    MEMO,
    after_commit,
    cleanup_latest,
    declared_horizon,
    gc_checkpoint,
    retained_from,
)
from blobstate.state.verify import verify

QUERY_ID = "5d7e0c2a-1b3f-4e5a-9c8d-7f6e5d4c3b2a"
REPEAT = 5
"""Each operation runs this often at each point: the most requests and the median seconds are kept
(the machine's load varies; the requests do not)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Requests:
    """Counts the HTTP requests an S3 store's client sends."""

    def __init__(self) -> None:
        self.n = 0

    def attach(self, store: Any) -> Any:
        store._client.meta.events.register("before-send.s3", self._count)
        return store

    def _count(self, **_: Any) -> None:
        self.n += 1


class History:
    """One checkpoint on S3 grown one version at a time through the real commit path."""

    def __init__(self, url: str, local: Path, partitions: int, retain: int, snapshot_every: int) -> None:
        self.url, self.local, self.partitions = url, local, partitions
        self.retain, self.snapshot_every = retain, snapshot_every
        self.store = open_blob_store(url)
        self.log = CommitLog(self.store)
        self.log.write_metadata(QueryMetadata(QUERY_ID, partitions, {"0": {"key_columns": ["k"]}}))
        self.previous: Commit | None = None
        self.needed_from = 0

    def batch(self, store: Any | None = None) -> None:
        """One version: every partition writes some keys and commits; the driver commits and cleans up."""
        store = store or self.store
        log = self.log if store is self.store else CommitLog(store)
        version = 1 if self.previous is None else self.previous.version + 1
        results = {}
        for p in range(self.partitions):
            committed = None if self.previous is None else self.previous.checkpoint_id("0", p)
            with open_partition(
                store, self.local, QUERY_ID, "0", p, committed,
                snapshot_every=self.snapshot_every, lock_timeout=5.0,
            ) as state:  # fmt: skip
                for i in range(20):
                    state.store.put("a", b"k%d" % ((version * 7 + i) % 500), b"v%d" % version)
                results[p] = state.commit()
        retained = retained_from(self.previous, version, self.retain)
        commit = Commit(
            version=version,
            checkpoints={"0": {p: r.checkpoint_id.uid for p, r in results.items()}},
            objects={"0": {p: r.objects for p, r in results.items()}},
            retained_from=retained,
            horizon=declared_horizon(self.previous, self.needed_from, retained),
            metrics={"seconds": 0.1, "partitions": {p: {"input_rows": 20} for p in range(self.partitions)}},
            writer="bench-driver",
        )
        log.write_commit(commit)
        stats = after_commit(store, commit, commit_log=log)
        self.needed_from = max(self.needed_from, stats.needed_from)
        self.previous = commit


def measure(url: str, history: History) -> dict[str, Any]:
    """Requests and seconds of each operation, each in a fresh process state (new client, no memo)."""
    out: dict[str, Any] = {}

    def run(name: str, op: Callable[[Any], Any]) -> None:
        requests, seconds = [], []
        for _ in range(REPEAT):
            MEMO.forget()
            counter = Requests()
            with open_blob_store(url) as store:
                counter.attach(store)
                started = time.perf_counter()
                op(store)
                seconds.append(time.perf_counter() - started)
                requests.append(counter.n)
        out[name] = {"requests": max(requests), "seconds": round(statistics.median(seconds), 3)}

    def check_verify(store: Any) -> None:
        report = verify(store)
        assert not report.problems, [str(p) for p in report.problems]

    run("verify", check_verify)
    run("gc --full", lambda s: gc_checkpoint(s, full=True))
    run("lineage", lambda s: collect_lineage(s))
    run("report", lambda s: load_batch_metrics(s, state_sizes=True))
    run("restart start-up", lambda s: cleanup_latest(s, CommitLog(s).scan()))
    MEMO.forget()
    counter = Requests()
    with open_blob_store(url) as store:
        counter.attach(store)
        history.batch(store)  # warm the memo after a restart: the first batch reads more
        requests, seconds = [], []
        for _ in range(REPEAT):
            counter.n = 0
            started = time.perf_counter()
            history.batch(store)
            seconds.append(time.perf_counter() - started)
            requests.append(counter.n)
        out["batch"] = {"requests": max(requests), "seconds": round(statistics.median(seconds), 3)}
    with open_blob_store(url) as store:
        started = time.perf_counter()
        for _ in range(50):
            store.exists("metadata.json")
        # The server's own speed at this point, to tell its slowing down from ours.
        out["probe_ms_per_request"] = round((time.perf_counter() - started) * 20, 2)
        commits = CommitLog(store).versions()
        out["commits_stored"] = len(commits)
        out["latest"] = commits[-1]
        out["commit_bytes"] = len(store.get(f"commits/{commits[-1]}.json"))
    return out


def main() -> None:
    """Grow one checkpoint to each of ``--commits`` and measure at each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[100, 2000])
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--retain", type=int, default=10)
    parser.add_argument("--snapshot-every", type=int, default=5)
    args = parser.parse_args()

    import boto3

    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = _free_port()
    # The moto server in its own process (as the tests' server is to Spark's workers), without its
    # request log: the client and the server do not share one interpreter's lock.
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    os.environ["BLOBSTATE_S3_ENDPOINT"] = endpoint
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/ckpt"
    results: dict[str, Any] = {"partitions": args.partitions, "min_versions_to_retain": args.retain,
                               "snapshot_every": args.snapshot_every}  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            history = History(url, Path(tmp), args.partitions, args.retain, args.snapshot_every)
            started = time.perf_counter()
            for target in sorted(args.commits):
                while history.previous is None or history.previous.version < target - 1 - REPEAT:
                    history.batch()
                results[str(target)] = measure(url, history)  # its batch measurement adds versions
            results["build_seconds"] = round(time.perf_counter() - started, 1)
            history.store.close()
    finally:
        server.terminate()
        server.wait()
    low, high = (str(n) for n in sorted(args.commits)[:1] + sorted(args.commits)[-1:])
    results["ratios"] = {
        op: {
            "requests": round(results[high][op]["requests"] / max(1, results[low][op]["requests"]), 3),
            "seconds": round(results[high][op]["seconds"] / max(1e-3, results[low][op]["seconds"]), 3),
        }
        for op in ("verify", "gc --full", "lineage", "report", "restart start-up", "batch")
    }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
