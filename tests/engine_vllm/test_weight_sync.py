"""Weight sync into a live in-process vLLM engine, the way TRL's colocate mode does it
(``model.load_weights`` on the driver worker's model), with vLLM's CPU weight prepacking left on
(``default``) and with the plugin's ``keep_cpu_weights`` (``kept``); each float32, the learner an
HF model given the same edits, the verdict the plugin's post-sync check."""

from __future__ import annotations

import pytest

from precision_plugin._core.canary.sync_check import FACTOR
from tests.engine_vllm.conftest import run_program


def _run(tied_model, tmp_path_factory, keep: bool) -> dict:
    # The default engine also has the plugin's import fail inside it (PRECISION_PLUGIN is set).
    config = {"model": tied_model, "dtype": "float32", "keep": keep, "break_plugin": not keep}
    env = {} if keep else {"PRECISION_PLUGIN": "float32"}
    return run_program("sync_inprocess", config, tmp_path_factory.mktemp(f"sync-{keep}"), **env)


@pytest.fixture(scope="module")
def default(tied_model, tmp_path_factory) -> dict:
    return _run(tied_model, tmp_path_factory, keep=False)


@pytest.fixture(scope="module")
def kept(tied_model, tmp_path_factory) -> dict:
    return _run(tied_model, tmp_path_factory, keep=True)


def test_the_engine_matches_the_learner_before_any_sync(default, kept):
    for run in (default, kept):
        assert not run["before"]["faulty"]
        assert run["before"]["max_gap"] < 1e-4  # float32 on both sides


def test_prepacked_linear_layers_refuse_the_sync(default):
    """vLLM replaced the Linear's weight by an empty Parameter after prepacking it."""
    assert default["linear_error"].startswith("AssertionError")
    assert "into parameter (torch.Size([0]))" in default["linear_error"]


def test_a_synced_tied_embedding_leaves_a_stale_lm_head_that_the_check_catches(default):
    """The load reports nothing, and the engine still samples from the LM head prepacked at load:
    the post-sync check finds its log-probs nats away, far beyond float32's rounding."""
    assert default["embedding_error"] is None
    after = default["after_embedding"]
    assert after["max_gap"] > 1.0
    assert after["faulty"] and after["ratio"] > 100 * FACTOR
    assert "does not compute with the weights it was sent" in after["message"]


def test_kept_weights_take_every_sync(kept):
    assert kept["linear_error"] is None and kept["embedding_error"] is None
    for name in ("after_linear", "after_embedding"):
        assert not kept[name]["faulty"], kept[name]
        assert kept[name]["max_gap"] < 1e-4


def test_an_import_error_of_the_plugin_inside_the_engine_is_caught_by_verify_engine(default):
    """vLLM logs the failed plugin once at ERROR and runs on; verify_engine finds the engine
    without the plugin's mark although PRECISION_PLUGIN asked for it."""
    assert "Failed to load plugin precision_plugin" in default["log"]
    statuses = [status for status, _ in default["verify"]]
    assert statuses == ["ok", "warning"], default["verify"]
    assert (
        "precision_plugin did not run inside the colocated vLLM engine" in default["verify"][1][1]
    )
