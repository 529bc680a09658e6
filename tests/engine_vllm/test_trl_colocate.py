"""TRL 1.16's GRPOTrainer with ``use_vllm=True, vllm_mode="colocate"`` on a live vLLM engine,
after ``precision_plugin.enable()`` (the recipe's trainer, integrations/trl/grpo_fp16.py, on the
tied Llama), 6 optimizer steps each with the canary checking every step:

- ``fp16`` and ``bf16``: the policy's dtype on both sides, the engine's Linear weights kept by
  the plugin (``vllm.cpu_keep_weights="auto"`` in colocate mode), every weight sync checked;
- ``stale_head``: float32 with ``cpu_keep_weights="off"`` after a user's own half fix (Linear
  layers keep their weights, the LM head stays prepacked): TRL's syncs report success and the
  engine samples from the LM head of the checkpoint; the post-sync check must say so at the
  first sync after an optimizer step.

Each run gets its own ``MASTER_PORT``: two colocate runs on 29500 collide (EADDRINUSE).
"""

from __future__ import annotations

import math

import pytest

from tests.engine_vllm.conftest import ROOT, free_port, run_program

STEPS = 6


def _train(tied_model, tmp_path_factory, dtype: str, *, keep: str, linear_only: bool) -> dict:
    config = {
        "model": tied_model,
        "recipe": str(ROOT / "integrations/trl/grpo_fp16.py"),
        "dtype": dtype,
        "steps": STEPS,
        "learning_rate": 1e-3,
        "keep": keep,
        "linear_only": linear_only,
    }
    workdir = tmp_path_factory.mktemp(f"trl-{dtype}-{keep}")
    return run_program("trl_colocate", config, workdir, MASTER_PORT=str(free_port()))


@pytest.fixture(scope="module")
def fp16(tied_model, tmp_path_factory) -> dict:
    return _train(tied_model, tmp_path_factory, "float16", keep="auto", linear_only=False)


@pytest.fixture(scope="module")
def bf16(tied_model, tmp_path_factory) -> dict:
    return _train(tied_model, tmp_path_factory, "bfloat16", keep="auto", linear_only=False)


@pytest.fixture(scope="module")
def stale_head(tied_model, tmp_path_factory) -> dict:
    return _train(tied_model, tmp_path_factory, "float32", keep="off", linear_only=True)


def _metric(run: dict, name: str) -> list[float | None]:
    return [h.get(f"precision/{name}") for h in run["history"] if f"precision/{name}" in h]


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_colocate_trains_in_the_policy_dtype_on_both_sides(name, request):
    run = request.getfixturevalue(name)
    dtype = {"fp16": "float16", "bf16": "bfloat16"}[name]
    assert run["error"] is None and run["steps"] == STEPS
    assert (run["fp16"], run["bf16"]) == (name == "fp16", name == "bf16")
    assert run["engine_dtype"] == f"torch.{dtype}"  # read from the live engine
    assert run["audit_rollout"] == {"engine": "vLLM (colocate)", "dtype": dtype}
    assert run["audit_contradictions"] == {}  # the audit's verdict: consistent
    assert [s for s, _ in run["verify"]] == ["ok"]


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_the_plugin_kept_the_engines_weights_and_every_sync_checks_out(name, request):
    run = request.getfixturevalue(name)
    assert run["kept_by_plugin"]  # the plugin's F.linear path, through its patcher
    syncs = run["sync_checks"]
    assert len(syncs) >= STEPS and [n for n, _, _ in syncs] == list(range(1, len(syncs) + 1))
    assert not any(faulty for _, _, faulty in syncs), syncs


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_telemetry_is_finite_and_the_canary_in_band(name, request):
    run = request.getfixturevalue(name)
    k3 = _metric(run, "k3_kl")
    assert len(k3) == STEPS and all(v is not None and v >= 0 for v in k3)
    in_band = [v for v in _metric(run, "canary_in_band") if v is not None]
    assert in_band and all(v == 1.0 for v in in_band)  # floor at the first full canary set
    assert all(v == 0.0 for v in _metric(run, "canary_verdict"))


def test_a_stale_lm_head_is_caught_at_the_first_sync_after_a_step(stale_head):
    run = stale_head
    assert run["error"] is None  # strictness "warn": said, not stopped
    assert not run["kept_by_plugin"]  # cpu_keep_weights="off"
    syncs = run["sync_checks"]
    # Sync 1 (step 0) pushes the checkpoint's own weights: nothing differs yet. Sync 2 follows
    # the first optimizer step, which moved the tied embedding away from the prepacked head.
    assert not syncs[0][2], syncs
    assert syncs[1][2] and syncs[1][1] > 8, syncs
    assert "weight_sync_fault: weight sync 2:" in run["log"]
    assert "does not compute with the weights it was sent" in run["log"]
    verdicts = _metric(run, "canary_verdict")
    assert 4.0 in verdicts  # precision/canary_verdict: the sync verdict
    assert all(math.isfinite(v) for v in _metric(run, "sync_check_ratio"))
