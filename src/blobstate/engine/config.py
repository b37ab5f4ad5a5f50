"""Query configuration: keywords of ``transform_with_state``, or Spark conf ``spark.blobstate.<key>``.

Options of an S3 checkpoint's blob store are the keyword ``blob_store_options={...}`` or Spark conf
``spark.blobstate.s3.<option>`` (see :mod:`blobstate.blobstore.s3_options`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blobstate import defaults
from blobstate.blobstore.azure_options import AZURE_CONF_PREFIX, azure_options_from_spark_conf
from blobstate.blobstore.redact import redact
from blobstate.blobstore.s3_options import S3OptionError, parse_s3_options
from blobstate.blobstore.schemes import location_without_options, scheme_of
from blobstate.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from blobstate.engine.watermark import InputWatermark

SPARK_CONF_PREFIX = "spark.blobstate."
S3_CONF_PREFIX = SPARK_CONF_PREFIX + "s3."


class QueryConfigError(ConfigurationError, ValueError):
    """An argument of ``transform_with_state`` or a query option (keyword or ``spark.blobstate.*`` conf)
    that is invalid; the message names it."""


class UnknownOptionError(ConfigurationError, TypeError):
    """A keyword argument or ``spark.blobstate.*`` key that is not a blobstate option."""


@dataclass(frozen=True)
class QueryConfig:
    """Every tunable of one blobstate query. Each field may also be set as ``spark.blobstate.<name>``."""

    operator: str = "0"
    """The stateful operator's id; one query may hold several operators under one checkpoint."""
    api: str = "pandas"
    """How handlers see rows: ``pandas`` (DataFrames in and out, as Spark's
    ``transformWithStateInPandas``), ``row`` (``pyspark.sql.Row`` objects, as Spark's row-based
    ``transformWithState``, with no pandas per key) or ``arrow`` (vectorized: one call per partition
    and batch, bulk state as Arrow columns; docs/ARROW_API.md)."""
    output_mode: str = "Update"
    """``Append`` or ``Update``, as in transformWithStateInPandas."""
    time_mode: str = "None"
    """``None``, ``ProcessingTime`` or ``EventTime``."""
    event_time_column: str | None = None
    """Event-time column (EventTime mode): the watermark is its maximum seen minus ``watermark_delay_ms``.
    Default: the input's ``withWatermark`` column, as in Spark."""
    watermark_delay_ms: int = 0
    """How late event-time rows may arrive before the watermark drops them. Default: the input's
    ``withWatermark`` delay, as in Spark (else 0)."""
    watermark_delay: str | None = None
    """The same delay as Spark users write it (``"10 minutes"``, ``"1 hour 30 seconds"``); sets
    ``watermark_delay_ms``."""
    local_dir: str = ""
    """Executor-local directory for working stores, checkpoints and replicas; empty (the default) means
    each executor's own ``<tmp>/blobstate-<uid>``, resolved on the executor."""
    local_dir_grace_seconds: float = defaults.LOCAL_DIR_GRACE_SECONDS
    """A partition's local directory (working store, local checkpoints, standby replica, broadcast copy)
    that no task, sync or reader has used for this long is removed by the executors' tasks, never
    while in use; the next use rebuilds it from the checkpoint."""
    snapshot_every: int = defaults.SNAPSHOT_EVERY
    """Upload a snapshot every this many versions of a partition."""
    snapshot_delta_bytes: int = defaults.SNAPSHOT_DELTA_BYTES
    """Also upload a snapshot once the deltas since the last one exceed this many bytes."""
    snapshot_upload: str = defaults.SNAPSHOT_UPLOAD
    """``background``: a due snapshot's files are uploaded by a thread of the Python worker while the next
    batches run, and a later commit names it once complete; ``inline``: inside the batch's commit (the
    batch that takes it waits for the upload)."""
    min_versions_to_retain: int = defaults.MIN_VERSIONS_TO_RETAIN
    """Committed versions kept restorable; older objects are deleted after each commit."""
    standby_replicas: int = 0
    """Standby replicas per partition, kept warm on other executors (other hosts where there are), so
    an executor loss moves its partitions without restoring their state."""
    standby_sync_seconds: float = 10.0
    """At most this long per standby sync task; a sync further behind continues in the next round, so
    syncs never hold an executor core long while the next batch waits."""
    max_warmup_replicas: int = 2
    """Partitions being moved onto a new executor at once (each first warmed up as a replica there)."""
    acceptable_recovery_lag: int = 1
    """A warmed-up replica takes its partition over once it is at most this many versions behind."""
    restart_executor_wait_seconds: float = 10.0
    """A restarted query's first batch waits up to this long for executors on the hosts where the last
    commit ran its partitions (a new application's executors register some seconds after it starts);
    partitions whose host has none by then move as if it were lost. 0: plan with the executors alive."""
    placement: bool = True
    """Give each partition's task a preferred executor (the JVM helper); off means Spark's default."""
    partitions_per_task: int = 0
    """State partitions that one task of the processing stage runs one after another (as Flink's
    subtasks run key groups): fewer, larger tasks where a stage has many small partitions. 0 (the
    default): automatic, one per task unless the stage has more than 8 partitions per core of the
    cluster, then about 4 tasks per core (Spark's default 200 partitions on 2 cores: 25 per task).
    Each partition is still loaded, committed and placed on its own; only partitions with the same
    preferred executor share a task."""
    trigger_interval: str | None = None
    """A processing-time trigger such as ``"5 seconds"``; None runs batches back to back."""
    spark_checkpoint: str | None = None
    """Spark's own streaming checkpoint (source offsets); default ``<checkpoint>/_spark``."""
    query_name: str | None = None
    """The streaming query's name."""
    write_through: bool = True
    """With a :class:`~blobstate.engine.sinks.WriterSink`, run the processing stage inside the sink's write
    (one Spark job, outputs never persisted nor read twice); off: the persisted path of any sink."""
    async_cleanup: bool = True
    """Run post-commit cleanup on a background thread, overlapping the next batch."""
    inline_output_bytes: int = 64 * 1024
    """A batch's outputs up to about this many bytes (Arrow; each partition's share of it) come to the
    driver with the tasks' metadata, in the stage's one Spark job, and the sink gets a DataFrame of that
    local data; larger outputs stay on the executors (persisted) and the sink's job reads them there.
    0: always the latter. (bench/fixed_cost.py: the local path saves 20-35 ms on a batch of a few KB;
    from a few hundred KB on, reading the persisted outputs is as fast or faster.)"""
    pandas_object_strings: bool = True
    """In Python workers, build pandas string columns with the object dtype (pandas < 3 behaviour,
    which PySpark 4.3 expects) instead of pandas 3's Arrow-backed ``str``: per-key DataFrames that a
    processor builds are about twice as cheap."""
    check_executor_python: bool = True
    """Before the query starts, run one Spark task that checks the executors' Python has blobstate and the
    modules its tasks import (and the driver's blobstate version), once per SparkContext and worker
    Python: a missing package is then one error at the start instead of a failed first batch. Off: no
    such task."""
    blob_store_options: dict[str, Any] = field(default_factory=dict, hash=False)
    """Options of an ``s3://`` checkpoint's blob store (``connect_timeout``, ``read_timeout``,
    ``max_attempts``, ``endpoint_url``, ...; see :class:`blobstate.blobstore.s3_options.S3Settings`), for
    the driver and every task. Spark conf ``spark.blobstate.s3.<option>`` sets one option; the keyword
    ``blob_store_options={...}`` wins option by option."""
    azure_options: dict[str, Any] = field(default_factory=dict, hash=False)
    """Options of an Azure checkpoint's store (``az://``, ``abfs[s]://``; see
    :mod:`blobstate.blobstore.azure_options`), from Spark conf ``spark.blobstate.azure.<option>``
    (secrets are refused there: give them by environment or identity)."""

    @classmethod
    def build(
        cls,
        spark_conf: dict[str, str],
        overrides: dict[str, Any],
        input_watermark: InputWatermark | None = None,
    ) -> QueryConfig:
        """Merge defaults, ``spark.blobstate.*`` conf and keyword overrides (keywords win); the
        event time not given there comes from ``input_watermark`` (the input's ``withWatermark``,
        see :func:`resolve_event_time`)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise UnknownOptionError(f"unknown blobstate option(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        s3_conf: dict[str, str] = {}
        for key, raw in spark_conf.items():
            if key.startswith(S3_CONF_PREFIX):
                s3_conf[key[len(S3_CONF_PREFIX) :]] = raw
                continue
            if key.startswith(AZURE_CONF_PREFIX):
                continue
            if not key.startswith(SPARK_CONF_PREFIX):
                continue
            name = key[len(SPARK_CONF_PREFIX) :]
            if name not in fields or name in ("blob_store_options", "azure_options"):
                raise QueryConfigError(f"unknown Spark conf {key!r}: not a blobstate option")
            values[name] = _coerce(name, fields[name].type, raw)
        overrides = dict(overrides)
        store_options = _blob_store_options(s3_conf, overrides.pop("blob_store_options", None))
        if "azure_options" in overrides:
            raise UnknownOptionError("azure_options is set by Spark conf spark.blobstate.azure.<option>")
        values["azure_options"] = azure_options_from_spark_conf(spark_conf)
        values.update({k: v for k, v in overrides.items() if v is not None})
        # As Spark does, modes are accepted in any case.
        for name, choices in MODES.items():
            if isinstance(values.get(name), str):
                values[name] = choices.get(values[name].lower(), values[name])
        if values.get("watermark_delay") is not None:
            delay_ms = parse_duration_ms(values["watermark_delay"], "watermark_delay")
            if "watermark_delay_ms" in values and values["watermark_delay_ms"] != delay_ms:
                raise QueryConfigError(
                    f"watermark_delay {values['watermark_delay']!r} and watermark_delay_ms "
                    f"{values['watermark_delay_ms']} disagree: give one of them"
                )
            values["watermark_delay_ms"] = delay_ms
        if input_watermark is not None:
            values["event_time_column"], values["watermark_delay_ms"] = resolve_event_time(
                values.get("event_time_column"),
                values.get("watermark_delay_ms"),
                input_watermark,
                delay_option=_delay_option(values),
            )
        config = cls(**values, blob_store_options=store_options)
        config.validate()
        return config

    def validate(self) -> None:
        """Reject inconsistent settings with an error naming the option."""
        if self.api not in defaults.APIS:
            raise QueryConfigError(
                f"api must be 'pandas' (transformWithStateInPandas), 'row' (transformWithState) or 'arrow'"
                f" (vectorized, ArrowStatefulProcessor), not {self.api!r}"
            )
        if self.output_mode not in defaults.OUTPUT_MODES:
            raise QueryConfigError(f"output_mode must be 'Append' or 'Update', not {self.output_mode!r}")
        if self.time_mode not in defaults.TIME_MODES:
            raise QueryConfigError(
                f"time_mode must be 'None', 'ProcessingTime' or 'EventTime', not {self.time_mode!r}"
            )
        if self.time_mode == "EventTime" and not self.event_time_column:
            raise QueryConfigError(
                "time_mode 'EventTime' needs an event-time column: declare it on the input with"
                " withWatermark(column, delay), as for Spark, or give event_time_column"
            )
        for name in ("snapshot_every", "min_versions_to_retain"):
            if getattr(self, name) < 1:
                raise QueryConfigError(f"{name} must be at least 1")
        if self.snapshot_upload not in defaults.SNAPSHOT_UPLOADS:
            raise QueryConfigError(
                f"snapshot_upload must be 'inline' or 'background', not {self.snapshot_upload!r}"
            )
        if self.standby_replicas < 0 or self.watermark_delay_ms < 0:
            raise QueryConfigError("standby_replicas and watermark_delay_ms must not be negative")
        if self.max_warmup_replicas < 0 or self.acceptable_recovery_lag < 0:
            raise QueryConfigError("max_warmup_replicas and acceptable_recovery_lag must not be negative")
        if self.inline_output_bytes < 0:
            raise QueryConfigError(
                f"inline_output_bytes must not be negative, not {self.inline_output_bytes}"
            )
        if self.restart_executor_wait_seconds < 0:
            raise QueryConfigError(
                "restart_executor_wait_seconds must not be negative, not"
                f" {self.restart_executor_wait_seconds!r}"
            )
        if self.local_dir_grace_seconds < 0:
            raise QueryConfigError(
                f"local_dir_grace_seconds must not be negative, not {self.local_dir_grace_seconds!r}"
            )
        if self.partitions_per_task < 0:
            raise QueryConfigError(
                f"partitions_per_task must not be negative (0: automatic), not {self.partitions_per_task!r}"
            )
        if self.standby_sync_seconds <= 0:
            raise QueryConfigError(
                f"standby_sync_seconds must be positive, not {self.standby_sync_seconds!r}"
            )


def resolve_event_time(
    event_time_column: str | None,
    watermark_delay_ms: int | None,
    input_watermark: InputWatermark | None,
    *,
    delay_option: str | None = None,
) -> tuple[str | None, int | None]:
    """The event-time column and watermark delay of a query: the options the user gave
    (``event_time_column``, ``watermark_delay``/``watermark_delay_ms``; None when not given) and the
    input's ``withWatermark`` (None without one), reconciled as Spark users expect.

    Without an input watermark the options stand as given. With one, an option not given takes the
    input's value, and an option given must agree with it: else :class:`QueryConfigError` names
    both. (As in Spark, the watermark is used only when the user asks for time mode EventTime.)
    ``delay_option`` is how the user wrote the delay (``"watermark_delay '5 minutes'"``), for the
    message.
    """
    if input_watermark is None:
        return event_time_column, watermark_delay_ms
    declared = f"the input's {input_watermark.describe()}"
    if event_time_column is not None and event_time_column != input_watermark.event_time_column:
        raise QueryConfigError(
            f"event_time_column {event_time_column!r} disagrees with {declared}: drop event_time_column"
            f" (the input's column is used, as in Spark) or name {input_watermark.event_time_column!r}"
        )
    if watermark_delay_ms is not None and watermark_delay_ms != input_watermark.delay_ms:
        given = delay_option or f"watermark_delay_ms {watermark_delay_ms}"
        raise QueryConfigError(
            f"{given} ({watermark_delay_ms} ms) disagrees with {declared} ({input_watermark.delay_ms} ms):"
            " drop the option (the input's delay is used, as in Spark) or give the same delay"
        )
    return input_watermark.event_time_column, input_watermark.delay_ms


def _delay_option(values: dict[str, Any]) -> str | None:
    """How the user gave the watermark delay, for messages."""
    if values.get("watermark_delay") is not None:
        return f"watermark_delay {values['watermark_delay']!r}"
    if "watermark_delay_ms" in values:
        return f"watermark_delay_ms {values['watermark_delay_ms']}"
    return None


def _blob_store_options(s3_conf: dict[str, str], keyword: Any) -> dict[str, Any]:
    """S3 options from Spark conf, then the keyword's (both checked; the keyword wins per option)."""
    options = parse_s3_options(s3_conf, f"Spark conf {S3_CONF_PREFIX}<option>")
    if keyword is not None:
        if not isinstance(keyword, Mapping):
            raise TypeError(f"blob_store_options must be a dict of S3 options, not {type(keyword).__name__}")
        options.update(parse_s3_options(keyword, "blob_store_options"))
    return options


def checkpoint_store_url(checkpoint_url: str, config: QueryConfig) -> str:
    """The URL the driver and every task open the checkpoint's blob store with.

    For an ``s3://`` checkpoint the query's ``blob_store_options`` become query parameters of the URL, so
    they reach the tasks with it (``TaskSpec.checkpoint_url``); options already in the checkpoint URL
    must agree with them. Other backends take no such options.
    """
    scheme = scheme_of(checkpoint_url)
    family_options = {"s3": config.blob_store_options, "azure": config.azure_options}
    if scheme.option_family is not None:
        return scheme.url_with_options(checkpoint_url, family_options[scheme.option_family])
    if config.blob_store_options:
        raise S3OptionError(
            f"blob_store_options {sorted(config.blob_store_options)} are S3 options, but the checkpoint"
            f" {redact(checkpoint_url)!r} is not on S3: drop the keyword blob_store_options or the Spark conf"
            f" {S3_CONF_PREFIX}<option>"
        )
    return checkpoint_url


def checkpoint_location(store_url: str) -> str:
    """The checkpoint's location without blob store options (an S3 URL's query is dropped)."""
    return location_without_options(store_url)


MODES: dict[str, dict[str, str]] = {
    "output_mode": {m.lower(): m for m in defaults.OUTPUT_MODES},
    "time_mode": {m.lower(): m for m in defaults.TIME_MODES},
}
"""Each mode option's accepted values, by their lowercase spelling."""

_DURATION_UNITS_MS = {
    "week": 7 * 24 * 3600 * 1000,
    "day": 24 * 3600 * 1000,
    "hour": 3600 * 1000,
    "minute": 60 * 1000,
    "min": 60 * 1000,
    "second": 1000,
    "sec": 1000,
    "millisecond": 1,
    "milli": 1,
    "ms": 1,
}
_DURATION_RE = re.compile(r"\s*(\d+)\s*([a-z]+)\s*")


def parse_duration_ms(text: str, option: str = "duration") -> int:
    """Milliseconds of a duration as Spark users write one (``withWatermark``, triggers).

    A sequence of ``<integer> <unit>`` (week, day, hour, minute/min, second/sec, millisecond/ms, each
    singular or plural, any case), optionally after ``interval``: ``"10 minutes"``,
    ``"1 hour 30 seconds"``. Anything else raises ValueError naming ``option``.
    """
    body = text.strip().lower()
    body = body.removeprefix("interval").strip()
    total, position = 0, 0
    for match in _DURATION_RE.finditer(body):
        if match.start() != position:
            break
        unit = match.group(2)
        unit = unit[:-1] if unit.endswith("s") and unit[:-1] in _DURATION_UNITS_MS else unit
        if unit not in _DURATION_UNITS_MS:
            raise QueryConfigError(f"{option}: unknown unit {match.group(2)!r} in {text!r}")
        total += int(match.group(1)) * _DURATION_UNITS_MS[unit]
        position = match.end()
    if not body or position != len(body):
        raise QueryConfigError(
            f"{option}: {text!r} is not a duration such as '10 minutes' or '1 hour 30 seconds'"
        )
    return total


def spark_blobstate_conf(spark: SparkSession) -> dict[str, str]:
    """The ``spark.blobstate.*`` settings of a session: the SparkContext's conf, overridden by the
    session's runtime conf (``spark.conf.set`` before the query starts), as Spark's own options are."""
    from blobstate.batch.jvm import is_connect

    conf: dict[str, str] = {}
    if not is_connect(spark):  # Connect: no SparkContext here
        conf = {k: v for k, v in spark.sparkContext.getConf().getAll() if k.startswith(SPARK_CONF_PREFIX)}
    try:
        runtime = spark.conf.getAll
    except Exception:  # an older PySpark without getAll: the SparkContext's conf only
        return conf
    conf.update({k: v for k, v in runtime.items() if k.startswith(SPARK_CONF_PREFIX)})
    return conf


def _coerce(name: str, annotation: object, raw: str) -> Any:
    text = str(annotation)
    if text.startswith("bool"):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise QueryConfigError(f"spark.blobstate.{name}: expected true or false, got {raw!r}")
    if text.startswith("int"):
        try:
            return int(raw)
        except ValueError:
            raise QueryConfigError(f"spark.blobstate.{name}: expected an integer, got {raw!r}") from None
    if text.startswith("float"):
        try:
            return float(raw)
        except ValueError:
            raise QueryConfigError(f"spark.blobstate.{name}: expected a number, got {raw!r}") from None
    return raw
