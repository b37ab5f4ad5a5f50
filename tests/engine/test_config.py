"""Query options from keywords and ``spark.blobstate.*`` conf."""

from __future__ import annotations

from typing import Any

import pytest

from blobstate.engine.config import (
    QueryConfig,
    QueryConfigError,
    checkpoint_location,
    checkpoint_store_url,
    parse_duration_ms,
    spark_blobstate_conf,
)


def test_spark_conf_is_read_and_keywords_win() -> None:
    conf = {"spark.blobstate.snapshot_every": "3", "spark.blobstate.placement": "false", "spark.x": "y"}
    config = QueryConfig.build(conf, {"snapshot_every": 5})
    assert config.snapshot_every == 5
    assert config.placement is False


def test_unknown_options_are_named() -> None:
    with pytest.raises(TypeError, match="snapshot_evry"):
        QueryConfig.build({}, {"snapshot_evry": 3})
    with pytest.raises(ValueError, match=r"spark\.blobstate\.bogus"):
        QueryConfig.build({"spark.blobstate.bogus": "1"}, {})


def test_bad_values_are_named() -> None:
    with pytest.raises(ValueError, match=r"spark\.blobstate\.snapshot_every"):
        QueryConfig.build({"spark.blobstate.snapshot_every": "often"}, {})
    with pytest.raises(ValueError, match="event_time_column"):
        QueryConfig.build({}, {"time_mode": "EventTime"})
    with pytest.raises(ValueError, match="output_mode"):
        QueryConfig.build({}, {"output_mode": "Complete"})
    with pytest.raises(ValueError, match=r"api must be 'pandas'.*'row'.*or 'arrow'.*not 'rows'"):
        QueryConfig.build({}, {"api": "rows"})


def test_partitions_per_task_from_spark_conf_automatic_by_default_never_negative() -> None:
    assert QueryConfig.build({}, {}).partitions_per_task == 0
    assert QueryConfig.build({"spark.blobstate.partitions_per_task": "25"}, {}).partitions_per_task == 25
    with pytest.raises(ValueError, match=r"partitions_per_task must not be negative \(0: automatic\)"):
        QueryConfig.build({}, {"partitions_per_task": -1})


def test_api_from_spark_conf() -> None:
    assert QueryConfig.build({}, {}).api == "pandas"
    assert QueryConfig.build({"spark.blobstate.api": "row"}, {}).api == "row"


def test_standby_options_from_keywords_and_spark_conf() -> None:
    conf = {"spark.blobstate.standby_replicas": "2", "spark.blobstate.standby_sync_seconds": "2.5"}
    config = QueryConfig.build(conf, {"max_warmup_replicas": 1})
    assert (config.standby_replicas, config.standby_sync_seconds, config.max_warmup_replicas) == (2, 2.5, 1)
    with pytest.raises(ValueError, match="standby_replicas and watermark_delay_ms must not be negative"):
        QueryConfig.build({}, {"standby_replicas": -1})
    with pytest.raises(ValueError, match="standby_sync_seconds must be positive"):
        QueryConfig.build({"spark.blobstate.standby_sync_seconds": "0"}, {})
    with pytest.raises(ValueError, match=r"spark\.blobstate\.standby_sync_seconds: expected a number"):
        QueryConfig.build({"spark.blobstate.standby_sync_seconds": "soon"}, {})


def test_local_dir_defaults_to_the_executors_own_directory() -> None:
    from blobstate.batch.executor import default_local_dir, resolve_local_dir

    assert QueryConfig.build({}, {}).local_dir == ""  # not a path computed on the driver
    assert resolve_local_dir("") == default_local_dir()
    assert resolve_local_dir("/data/x") == "/data/x"


# --------------------------------------------------------------------------- S3 blob store options
def test_s3_options_from_spark_conf_and_the_keyword_win_per_option() -> None:
    conf = {"spark.blobstate.s3.read_timeout": "30", "spark.blobstate.s3.max_attempts": "6"}
    assert QueryConfig.build(conf, {}).blob_store_options == {"read_timeout": 30.0, "max_attempts": 6}
    config = QueryConfig.build(conf, {"blob_store_options": {"read_timeout": 5, "connect_timeout": "2"}})
    assert config.blob_store_options == {"read_timeout": 5.0, "max_attempts": 6, "connect_timeout": 2.0}
    assert QueryConfig.build({}, {}).blob_store_options == {}


def test_bad_s3_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"spark\.blobstate\.s3\.<option>: bogus"):
        QueryConfig.build({"spark.blobstate.s3.bogus": "1"}, {})
    with pytest.raises(ValueError, match=r"read_timeout in Spark conf .*got 'soon'"):
        QueryConfig.build({"spark.blobstate.s3.read_timeout": "soon"}, {})
    with pytest.raises(ValueError, match=r"in blob_store_options: read_timout"):
        QueryConfig.build({}, {"blob_store_options": {"read_timout": 1}})
    with pytest.raises(TypeError, match="blob_store_options must be a dict"):
        QueryConfig.build({}, {"blob_store_options": "read_timeout=1"})
    with pytest.raises(ValueError, match=r"unknown Spark conf 'spark\.blobstate\.blob_store_options'"):
        QueryConfig.build({"spark.blobstate.blob_store_options": "{}"}, {})


def test_the_store_url_carries_the_options_to_the_tasks() -> None:
    from blobstate.batch.executor import blob_store_for
    from blobstate.blobstore import open_blob_store

    options = {"endpoint_url": "http://127.0.0.1:1", "read_timeout": 7.5, "max_attempts": 2}
    config = QueryConfig.build({"spark.blobstate.s3.connect_timeout": "3"}, {"blob_store_options": options})
    url = checkpoint_store_url("s3://bucket/ckpt", config)
    assert checkpoint_location(url) == "s3://bucket/ckpt"
    store = blob_store_for(url)  # as every task opens it
    with open_blob_store(url) as driver_store:
        for s in (store, driver_store):
            assert (s.url, s.max_attempts) == ("s3://bucket/ckpt", 2)
            assert s._client.meta.config.read_timeout == 7.5
            assert s._client.meta.config.connect_timeout == 3.0
            assert s.endpoint == "http://127.0.0.1:1"


def test_store_url_agrees_with_the_checkpoint_url_and_refuses_options_off_s3() -> None:
    config = QueryConfig.build({}, {"blob_store_options": {"read_timeout": 5}})
    assert checkpoint_store_url("s3://b/c?read_timeout=5.0", config) == "s3://b/c?read_timeout=5.0"
    with pytest.raises(ValueError, match=r"read_timeout is 9\.0 in the URL"):
        checkpoint_store_url("s3://b/c?read_timeout=9", config)
    with pytest.raises(ValueError, match=r"\['read_timeout'\] are S3 options, but the checkpoint '/data/c'"):
        checkpoint_store_url("/data/c", config)
    assert checkpoint_store_url("/data/c", QueryConfig.build({}, {})) == "/data/c"
    assert checkpoint_location("s3://b/c/?max_attempts=2") == "s3://b/c"


def test_modes_are_accepted_in_any_case_as_spark_does() -> None:
    config = QueryConfig.build(
        {"spark.blobstate.time_mode": "eventtime"},
        {"output_mode": "append", "event_time_column": "ts"},
    )
    assert (config.output_mode, config.time_mode) == ("Append", "EventTime")
    assert QueryConfig.build({}, {"time_mode": "PROCESSINGTIME"}).time_mode == "ProcessingTime"
    with pytest.raises(ValueError, match="output_mode must be"):
        QueryConfig.build({}, {"output_mode": "complete"})


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("10 minutes", 600_000),
        ("1 hour 30 seconds", 3_630_000),
        ("INTERVAL 2 Days", 172_800_000),
        ("500 milliseconds", 500),
        ("1 min", 60_000),
        ("0 seconds", 0),
    ],
)
def test_watermark_delay_as_spark_users_write_it(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms
    assert QueryConfig.build({}, {"watermark_delay": text}).watermark_delay_ms == ms
    assert QueryConfig.build({"spark.blobstate.watermark_delay": text}, {}).watermark_delay_ms == ms


@pytest.mark.parametrize("text", ["", "ten minutes", "10", "10 fortnights", "10 minutes later", "-5 seconds"])
def test_a_bad_duration_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="watermark_delay"):
        QueryConfig.build({}, {"watermark_delay": text})


def test_watermark_delay_and_watermark_delay_ms_must_agree() -> None:
    assert QueryConfig.build({}, {"watermark_delay": "1 second", "watermark_delay_ms": 1000})
    with pytest.raises(ValueError, match="disagree"):
        QueryConfig.build({}, {"watermark_delay": "1 second", "watermark_delay_ms": 5})


@pytest.mark.spark
def test_spark_conf_set_at_run_time_is_honoured(spark: Any) -> None:
    spark.conf.set("spark.blobstate.snapshot_every", "3")
    spark.conf.set("spark.blobstate.output_mode", "append")
    try:
        config = QueryConfig.build(spark_blobstate_conf(spark), {})
    finally:
        spark.conf.unset("spark.blobstate.snapshot_every")
        spark.conf.unset("spark.blobstate.output_mode")
    assert (config.snapshot_every, config.output_mode) == (3, "Append")


def test_azure_options_from_spark_conf_travel_with_the_store_url_and_secrets_are_refused() -> None:
    from blobstate.blobstore.azure_options import AzureOptionError
    from blobstate.engine.query import spark_checkpoint_location

    config = QueryConfig.build({"spark.blobstate.azure.read_timeout": "45"}, {})
    assert config.azure_options == {"read_timeout": 45.0}
    url = checkpoint_store_url("az://box/ckpt", config)
    assert url == "az://box/ckpt?read_timeout=45.0"
    assert checkpoint_location(url) == "az://box/ckpt"
    with pytest.raises(AzureOptionError, match="account_key"):
        QueryConfig.build({"spark.blobstate.azure.account_key": "c2VjcmV0"}, {})
    # Spark's own checkpoint sits beside an account-qualified URL through ABFS; a bare az:// URL names no
    # account, so the query must say where Spark writes.
    named = "abfss://box@acct.dfs.core.windows.net/ckpt"
    assert spark_checkpoint_location(named, config) == "abfss://box@acct.dfs.core.windows.net/ckpt/_spark"
    with pytest.raises(QueryConfigError, match="spark_checkpoint"):
        spark_checkpoint_location("az://box/ckpt", config)


def test_snapshot_upload_defaults_to_background_and_is_checked() -> None:
    assert QueryConfig.build({}, {}).snapshot_upload == "background"
    assert QueryConfig.build({"spark.blobstate.snapshot_upload": "inline"}, {}).snapshot_upload == "inline"
    with pytest.raises(ValueError, match=r"snapshot_upload must be 'inline' or 'background', not 'later'"):
        QueryConfig.build({}, {"snapshot_upload": "later"})


@pytest.mark.spark
def test_the_partition_count_defaults_as_spark_chooses_it(spark: Any, tmp_path: Any) -> None:
    from blobstate.blobstore import open_blob_store
    from blobstate.engine.query import default_num_partitions
    from blobstate.lineage.commitlog import CommitLog, QueryMetadata

    store = open_blob_store(str(tmp_path / "ckpt"))
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "7")
        assert default_num_partitions(store, spark) == 7  # a new checkpoint: the session's shuffle count
        CommitLog(store).write_metadata(QueryMetadata.new(3, {"0": {"key_columns": ["k"]}}))
        assert default_num_partitions(CommitLog(store).store, spark) == 3  # an existing one keeps its own
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
