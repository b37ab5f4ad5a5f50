"""Query options from keywords and ``spark.blobstate.*`` conf."""

from __future__ import annotations

import pytest

from blobstate.engine.config import QueryConfig


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
    with pytest.raises(ValueError, match=r"api must be 'pandas'.*or 'row'.*'rows'"):
        QueryConfig.build({}, {"api": "rows"})


def test_api_from_spark_conf() -> None:
    assert QueryConfig.build({}, {}).api == "pandas"
    assert QueryConfig.build({"spark.blobstate.api": "row"}, {}).api == "row"


def test_standby_replicas_are_refused_until_supported() -> None:
    with pytest.raises(ValueError, match="standby_replicas=1"):
        QueryConfig.build({}, {"standby_replicas": 1})
