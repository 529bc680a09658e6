"""One way to settle a setting that contradicts the policy, per strictness."""

from __future__ import annotations

import logging

import pytest

from precision_plugin import PrecisionMismatchError, PrecisionPluginError
from precision_plugin.errors import settle_conflict


def test_error_refuses_with_message_and_fix():
    with pytest.raises(PrecisionMismatchError) as err:
        settle_conflict("error", "X asked bf16", fix="pass fp16", outcome="running fp16")
    assert str(err.value) == (
        "precision_plugin: X asked bf16 (strictness='error'). Fix: pass fp16."
    )
    assert isinstance(err.value, PrecisionPluginError) and isinstance(err.value, RuntimeError)


def test_warn_logs_what_runs_instead(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        settle_conflict("warn", "X asked bf16", fix="pass fp16", outcome="running fp16")
    assert caplog.messages == ["precision_plugin: X asked bf16; running fp16."]
