"""The Connect seam's refusal without a server plugin, without a server: one line, no secret."""

from __future__ import annotations

from typing import Any

import pytest

from blobstate.engine.jvm.connect import ConnectJvm, ConnectPluginMissingError


def test_the_refusal_names_the_plugin_in_one_line_and_masks_a_token_the_server_error_repeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seam = ConnectJvm(object())  # type: ignore[arg-type]  # no session is reached: _ask fails first

    def unanswered(*_: Any, **__: Any) -> Any:
        raise RuntimeError("cannot reach sc://spark.example:15002/;token=s3cr3t-t0ken\n  at grpc ...")

    monkeypatch.setattr(seam, "_ask", unanswered)
    with pytest.raises(ConnectPluginMissingError) as refused:
        seam.require_plugin()
    message = str(refused.value)
    assert "\n" not in message
    assert "s3cr3t-t0ken" not in message and "token=***" in message
    assert "spark.connect.extensions.relation.classes=org.apache.spark.sql.blobstate.ConnectPlugin" in message
    assert not seam.load_helper()  # the same refusal, as a warning and False
