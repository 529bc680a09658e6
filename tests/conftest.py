"""Shared fixtures: every test starts and ends with the plugin disabled."""

from __future__ import annotations

import os

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _plugin_disabled():
    """Leave no patch behind, whatever the test did."""
    import precision_plugin

    precision_plugin.disable()
    yield
    precision_plugin.disable()
