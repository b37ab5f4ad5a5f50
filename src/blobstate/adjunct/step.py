"""The adjunct stores' per-batch step (``blobstate.batch.steps``): the driver's part of side streams,
and the JSON form of a broadcast store's pending version in the tasks' plan (``task_step.py`` is the
executor's part)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from blobstate.adjunct.broadcast import PendingVersion, Written, write_version
from blobstate.adjunct.decision import StartDecision, decide
from blobstate.adjunct.history import FileSource, file_source_of, files_up_to, history_frame, is_rate_limited
from blobstate.adjunct.order import batch_files
from blobstate.adjunct.records import ApplyStats, in_order
from blobstate.adjunct.spec import BROADCAST, TAG_COLUMN, Adjunct, AdjunctSpec
from blobstate.adjunct.task_step import AdjunctPlan, AdjunctTaskStep
from blobstate.adjunct.union import numbered, side_rows
from blobstate.batch.contracts import JsonObject, JsonValue, PartitionSpec, TaskResult, as_int
from blobstate.batch.executor import resolve_local_dir
from blobstate.batch.jvm import JvmSeam, SourceLeaf
from blobstate.batch.steps import CommitPart, PreparedBatch, SparkCheckpointFiles
from blobstate.blobstore import BlobStore
from blobstate.ids import CheckpointId, new_uid
from blobstate.lineage.commitlog import Commit

log = logging.getLogger("blobstate")


def pending_json(pending: PendingVersion) -> JsonObject:
    """A broadcast store's pending version as the batch's plan carries it to the tasks."""
    return {
        "version": pending.version,
        "uid": pending.uid,
        "base_uid": pending.base_uid,
        "delta_ref": pending.delta_ref,
        "delta_lineage": list(pending.delta_lineage),
        "snapshot": pending.snapshot,
    }


def pending_from_json(data: JsonObject) -> PendingVersion:
    """The pending version :func:`pending_json` wrote."""
    lineage = data["delta_lineage"]
    delta_ref = data["delta_ref"]
    assert isinstance(lineage, list) and isinstance(delta_ref, dict)
    base_uid = data["base_uid"]
    return PendingVersion(
        version=int(data["version"]),  # type: ignore[arg-type]
        uid=str(data["uid"]),
        base_uid=None if base_uid is None else str(base_uid),
        delta_ref=delta_ref,
        delta_lineage=tuple(str(u) for u in lineage),
        snapshot=bool(data["snapshot"]),
    )


@dataclass(frozen=True)
class SideStreamFacts:
    """What an adjunct's start decision reads of its side stream's plan (through the JVM seam): taken
    where the query starts, so that a Spark Connect client can ship them to the server's driver."""

    rate_limited: bool
    """Whether a source of the side stream reads a bounded amount per batch (``maxFilesPerTrigger``...)."""
    plain_source: SourceLeaf | None
    """The streaming relation the side stream reads as it is (``JvmSeam.plain_source``), if it does."""
    columns: tuple[str, ...]
    """The side stream's columns."""


def side_stream_facts(jvm: JvmSeam, adjunct: Adjunct, leaves: Sequence[SourceLeaf]) -> SideStreamFacts:
    """:class:`SideStreamFacts` of ``adjunct``'s side stream, whose plan has ``leaves``
    (``JvmSeam.streaming_leaves``)."""
    return SideStreamFacts(
        rate_limited=is_rate_limited(leaves),
        plain_source=jvm.plain_source(adjunct.df),
        columns=tuple(adjunct.df.columns),
    )


@dataclass(frozen=True)
class AdjunctStart:
    """What the adjunct step is built from that the start reads of the query's DataFrames: taken where
    the query starts (a Spark Connect client ships it to the server's driver)."""

    specs: tuple[AdjunctSpec, ...]
    sources: dict[str, tuple[int, int]]
    """Each adjunct's sources in Spark's offset log: (index of the first, how many)."""
    side_streams: tuple[SideStreamFacts, ...]
    main_types: dict[str, DataType]
    """The main stream's column types."""

    def holds_main_rows(self, latest: Commit) -> bool:
        """Whether a run starting after ``latest`` holds main rows for a bootstrap store's backlog at
        first (as :meth:`AdjunctStep.decide_at_start` will decide), so wants a batch without new input."""
        recorded = (latest.metrics or {}).get("adjuncts") or {}
        for spec, facts in zip(self.specs, self.side_streams, strict=True):
            mine = recorded.get(spec.name)
            if mine is None and decide(spec, None, 0, rate_limited=facts.rate_limited).wait_for_backlog:
                return True
            if (mine or {}).get("waiting_for_backlog"):
                return True
        return False


def adjunct_start(
    jvm: JvmSeam, main: DataFrame, adjuncts: Sequence[Adjunct], specs: Sequence[AdjunctSpec]
) -> AdjunctStart | None:
    """The :class:`AdjunctStart` of a query whose main stream is ``main`` (None: no side streams)."""
    if not specs:
        return None
    from blobstate.adjunct.union import count_sources

    sources: dict[str, tuple[int, int]] = {}
    facts: list[SideStreamFacts] = []
    position = count_sources(jvm.streaming_leaves(main))  # side streams' sources follow the main's
    for adjunct in adjuncts:
        leaves = jvm.streaming_leaves(adjunct.df)  # one plan reading (a server round trip over Connect)
        count = count_sources(leaves)
        sources[adjunct.name] = (position, count)
        position += count
        facts.append(side_stream_facts(jvm, adjunct, leaves))
    return AdjunctStart(
        specs=tuple(specs),
        sources=sources,
        side_streams=tuple(facts),
        main_types={f.name: f.dataType for f in main.schema.fields},
    )


class AdjunctStep:
    """The driver's part of a query's side streams, one step of every batch (``batch.steps``).

    At start (:meth:`decide_at_start`) it takes each adjunct store's recovery decision
    (``adjunct.decision``). Each batch it then numbers the input's rows, writes every broadcast store's
    version (the driver is its one writer), reloads the history a re-created store reads again, holds
    main rows while a bootstrap store still loads a rate-limited backlog, and plans what the tasks
    apply (:class:`~blobstate.adjunct.task_step.AdjunctPlan`, shipped as their
    :class:`~blobstate.adjunct.task_step.AdjunctTaskStep`); its commit part records the broadcast
    stores' checkpoints, what each store took (``metrics.adjuncts``) and the side streams' offsets.
    """

    name = "adjuncts"

    def __init__(
        self,
        spark: SparkSession,
        store: BlobStore,
        where: PartitionSpec,
        adjuncts: Sequence[AdjunctSpec],
        sources: Mapping[str, tuple[int, int]],
        main_types: Mapping[str, DataType],
        key_columns: tuple[str, ...],
        spark_files: SparkCheckpointFiles | None,
    ) -> None:
        self.adjuncts = tuple(adjuncts)
        self.sources = dict(sources)
        """Each adjunct's sources in Spark's offset log: (index of the first, how many)."""
        self.waiting: set[str] = set()
        """Bootstrap adjuncts still loading a rate-limited side stream's backlog: main rows are held."""
        self.start_decisions: dict[str, StartDecision] = {}
        """What each adjunct store does at this start: applied by the run's first batch."""
        self._spark = spark
        self._store = store
        self._where = where
        self._main_types = dict(main_types)
        self._key_columns = key_columns
        self._spark_files = spark_files
        self._reload_sources: dict[str, FileSource] = {}
        self._reload_files: dict[str, list[str]] = {}
        self._start_applied = False
        self._batch: _BatchAdjuncts | None = None

    # ------------------------------------------------------------------ start
    def decide_at_start(self, side_streams: Sequence[SideStreamFacts], latest: Commit | None) -> None:
        """The recovery decision table for each adjunct store at this start (``adjunct.decision``);
        ``side_streams``: what the start read of each declared adjunct's side stream, in order."""
        recorded = ((latest.metrics or {}).get("adjuncts") or {}) if latest is not None else {}
        now_ms = int(time.time() * 1000)
        exists = self._spark_files.exists if self._spark_files is not None else (lambda uri: False)
        for facts, spec in zip(side_streams, self.adjuncts, strict=True):
            mine = recorded.get(spec.name) if latest is not None else None
            # The files up to the recorded offset, listed once: those the source lost make a persistent
            # store invalid, and a reload reads those it still has.
            files = self.side_files(spec.name, latest) if mine is not None else []
            present = [f for f in files if exists(f)] if spec.persistent or spec.bootstrap else []
            kept = set(present)
            lost = [f for f in files if f not in kept] if spec.persistent else []
            decision = decide(spec, mine, now_ms, rate_limited=facts.rate_limited, lost=lost)
            log.info("adjunct %s: store %s: %s", spec.name, decision.found, decision.reason)
            self.start_decisions[spec.name] = decision
            if decision.reload:
                self._reload_sources[spec.name] = file_source_of(spec.name, facts.plain_source, facts.columns)
                self._reload_files[spec.name] = present
            if decision.wait_for_backlog or (mine or {}).get("waiting_for_backlog"):
                self.waiting.add(spec.name)

    def side_files(self, name: str, commit: Commit | None) -> list[str]:
        """The files adjunct ``name``'s file source read up to ``commit``'s recorded offset, in order (from
        the source's log in Spark's checkpoint; empty when nothing is recorded)."""
        recorded = ((commit.adjunct_offsets or {}).get(name) if commit is not None else None) or []
        if not recorded or not isinstance(recorded[0], dict) or "logOffset" not in recorded[0]:
            return []
        assert self._spark_files is not None
        first, _ = self.sources[name]
        log_dir = f"sources/{first}"
        files = self._spark_files
        logs = {n: files.read_file(f"{log_dir}/{n}") for n in files.list_dir(log_dir)}
        return files_up_to(logs, int(recorded[0]["logOffset"]))

    # ------------------------------------------------------------------ the step
    def prepare(self, batch: PreparedBatch) -> None:
        """Number the input, write the broadcast stores' versions, plan what the tasks apply."""
        offsets = batch.spark_files.offsets if batch.spark_files is not None else None
        decisions = {} if self._start_applied else self.start_decisions
        reload = self._reload_frames(decisions)
        frame = numbered(batch.frame)
        defer_main = self._still_waiting(batch.previous, offsets)
        files = self._batch_side_files(batch.previous, offsets)
        broadcast = self._write_broadcast(frame, batch.previous, decisions, reload, files)
        plan = AdjunctPlan(
            recreate=tuple(n for n, d in decisions.items() if d.recreate and n not in broadcast),
            defer_main=defer_main,
            broadcast={name: pending_json(w.pending) for name, w in broadcast.items()},
            side_files={n: f for n, f in files.items() if n not in broadcast},
        )
        batch.task_steps.append(AdjunctTaskStep(self.adjuncts, plan))
        for name, reloaded in reload.items():  # partitioned stores' history, tagged like side rows
            if name not in broadcast:
                frame = frame.unionByName(reloaded, allowMissingColumns=True)
        if broadcast:  # the driver applied the broadcast side rows: they are not shuffled
            partitioned = [a.name for a in self.adjuncts if a.name not in broadcast]
            tag = F.col(TAG_COLUMN)
            frame = frame.filter(tag.isNull() | tag.isin(partitioned) if partitioned else tag.isNull())
        batch.frame = frame
        self._batch = _BatchAdjuncts(broadcast, decisions, offsets)

    def contribute(self, batch: PreparedBatch, results: Mapping[int, TaskResult]) -> CommitPart:
        """The broadcast stores' checkpoints, ``metrics.adjuncts`` and the side streams' offsets."""
        assert self._batch is not None
        part = CommitPart()
        for name, written in self._batch.broadcast.items():
            operator = self._adjunct(name).operator
            part.checkpoints[operator] = {0: written.pending.uid}
            part.objects[operator] = {0: written.objects}
        part.metrics["adjuncts"] = self._metrics(results, batch.previous)
        part.adjunct_offsets = self._offsets(self._batch.offsets)
        return part

    def after_commit(self, commit: Commit, results: Mapping[int, TaskResult]) -> None:
        """The start's decisions are applied once a batch committed."""
        self._start_applied = True

    def wants_another_batch(self) -> bool:
        """While main rows are held for a bootstrap, the next batch must come even without new input."""
        return bool(self.waiting)

    def stop(self) -> None:
        """Nothing runs in the background."""

    # ------------------------------------------------------------------ internals
    def _adjunct(self, name: str) -> AdjunctSpec:
        return next(a for a in self.adjuncts if a.name == name)

    def _write_broadcast(
        self,
        frame: DataFrame,
        previous: Commit | None,
        decisions: Mapping[str, StartDecision],
        reload: Mapping[str, DataFrame],
        files: Mapping[str, tuple[str, ...]],
    ) -> dict[str, Written]:
        """Write this batch's version of every broadcast adjunct store (the driver is its one writer):
        emptied first when the start decided to re-create it, its reloaded history, then the batch's
        own side rows (``files``: their files in the source's order)."""
        written: dict[str, Written] = {}
        for adjunct in self.adjuncts:
            if adjunct.mode != BROADCAST:
                continue
            rows = frame.filter(F.col(TAG_COLUMN) == adjunct.name).toArrow()
            if adjunct.name in reload:
                history = reload[adjunct.name].toArrow()
                rows = pa.concat_tables(
                    [history, rows.select(history.column_names)], promote_options="permissive"
                )
            rows = in_order(rows, files.get(adjunct.name))
            committed = None
            if previous is not None:
                committed = CheckpointId(previous.version, previous.checkpoints[adjunct.operator][0])
            written[adjunct.name] = write_version(
                self._store,
                resolve_local_dir(self._where.local_dir),
                self._where.query_id,
                adjunct,
                committed,
                rows,
                uid=new_uid(),
                snapshot_every=self._where.snapshot_every,
                snapshot_delta_bytes=self._where.snapshot_delta_bytes,
                recreate=adjunct.name in decisions and decisions[adjunct.name].recreate,
            )
        return written

    def _reload_frames(self, decisions: Mapping[str, StartDecision]) -> dict[str, DataFrame]:
        """The side stream history each re-created bootstrap store reads again: the files listed at start
        (up to the offset of the last commit, those the source still has), in the layout of the query's
        input (applied before the batch's side rows)."""
        frames: dict[str, DataFrame] = {}
        for name, decision in decisions.items():
            files = self._reload_files.get(name) if decision.reload else None
            if not files:
                continue
            history = history_frame(self._spark, self._reload_sources[name], files)
            order = (F.lit(0), F.col("__rank"), F.col("__row"))
            frames[name] = side_rows(self._adjunct(name), history, self._key_columns, self._main_types, order)
        return frames

    def _batch_side_files(self, previous: Commit | None, offsets: bytes | None) -> dict[str, tuple[str, ...]]:
        """Each file-source side stream's files in this batch in its source's order, when it read more
        than one (``adjunct.order.batch_files``)."""
        if offsets is None or self._spark_files is None:
            return {}
        before = (previous.adjunct_offsets or {}) if previous is not None else {}
        return batch_files(
            self.sources,
            self._offsets(offsets),
            before,
            self._spark_files.list_dir,
            self._spark_files.read_file,
        )

    def _still_waiting(self, previous: Commit | None, offsets: bytes | None) -> bool:
        """Whether this batch holds its main rows back: a bootstrap adjunct of a new store is still
        loading a rate-limited side stream's backlog. It is loaded once a batch finds no new side
        rows (its side offsets are those of the batch before)."""
        if not self.waiting:
            return False
        if offsets is None:
            log.warning("cannot read Spark's offset log: held main rows are processed now")
            self.waiting.clear()
            return False
        current = self._offsets(offsets)
        before = (previous.adjunct_offsets or {}) if previous is not None else {}
        for name in sorted(self.waiting):
            if previous is not None and name in before and before[name] == current.get(name):
                self.waiting.discard(name)
                log.info(
                    "adjunct %s: the side stream's backlog is loaded; held main rows are processed", name
                )
        return bool(self.waiting)

    def _offsets(self, offsets: bytes | None) -> JsonObject:
        """Each side stream's offsets for this batch, from Spark's offset log entry (empty: unknown)."""
        if offsets is None:
            return {}
        lines = offsets.decode("utf-8", errors="replace").splitlines()[2:]
        out: JsonObject = {}
        for name, (first, count) in self.sources.items():
            parsed: list[JsonValue] = []
            for line in lines[first : first + count]:
                try:
                    parsed.append(json.loads(line))
                except ValueError:
                    parsed.append(line)
            out[name] = parsed
        return out

    def _metrics(self, results: Mapping[int, TaskResult], previous: Commit | None) -> JsonObject:
        """What each adjunct store took in this batch, and when it last changed (for its validity)."""
        assert self._batch is not None
        broadcast, decisions = self._batch.broadcast, self._batch.decisions
        before = ((previous.metrics or {}).get("adjuncts") or {}) if previous is not None else {}
        now_ms = int(time.time() * 1000)
        out: JsonObject = {}
        for adjunct in self.adjuncts:
            totals = ApplyStats()
            if adjunct.name in broadcast:
                totals.add(broadcast[adjunct.name].stats)
            else:
                for r in results.values():
                    applied = (r.adjuncts or {}).get(adjunct.name)
                    if applied:
                        totals.add(ApplyStats(**applied))  # type: ignore[arg-type]
            last = before.get(adjunct.name) or {}
            decision = decisions.get(adjunct.name)
            recreated = decision is not None and decision.recreate
            out[adjunct.name] = {
                "mode": adjunct.mode,
                **totals.to_json(),
                "total_rows": (0 if recreated else int(last.get("total_rows", 0))) + totals.rows,
                "created_ms": now_ms if recreated else last.get("created_ms", now_ms),
                "updated_ms": now_ms if totals.rows or recreated else last.get("updated_ms", now_ms),
                "waiting_for_backlog": adjunct.name in self.waiting,
                **({"start": decision.to_json()} if decision is not None else {}),
            }
        held = [r.adjuncts or {} for r in results.values()]
        out["$held_rows"] = {
            "deferred": sum(as_int(h.get("$deferred", 0)) for h in held),
            "released": sum(as_int(h.get("$released", 0)) for h in held),
        }
        return out


@dataclass(frozen=True)
class _BatchAdjuncts:
    """What :meth:`AdjunctStep.prepare` decided for the running batch, for its commit part."""

    broadcast: dict[str, Written]
    decisions: Mapping[str, StartDecision]
    offsets: bytes | None
