"""Fixtures shared by the framework integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_accelerator_state(monkeypatch):
    """Accelerate keeps one process-wide state; each test builds its own Accelerator."""
    from accelerate.state import AcceleratorState

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
