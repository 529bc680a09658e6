"""The plugin inside a running vLLM engine (offline ``LLM``), two engine processes:

- ``plugin_engine``: ``PRECISION_PLUGIN`` (float16, ``vllm.cpu_keep_weights="on"``) and
  ``LLM(model, dtype="bfloat16")``: the general plugin, loaded by vLLM in each of its processes,
  runs the engine in float16 and keeps the CPU build's Linear weights there;
- ``excluded_engine``: the same variable, but ``VLLM_PLUGINS`` names another plugin, and the
  kwargs come from ``engine_kwargs({"model": ...}, "bfloat16")``: vLLM is left alone and runs
  what ``engine_kwargs`` asked (an in-process engine: vLLM loads general plugins there too).

Both sample 4 prompts x 64 tokens with raw log-probs; the HF learner scores the same tokens.
"""

from __future__ import annotations

import math
import re

import pytest

from tests.engine_vllm.conftest import run_program

PROMPTS = [[1, *b"The capital of"], [1, *b"def fib(n):"], [1, *b"Once upon a"], [1, *b"1, 2, 3,"]]
TOKENS = 64


@pytest.fixture(scope="module")
def plugin_engine(tied_model, tmp_path_factory) -> dict:
    config = {
        "model": tied_model,
        "llm": {"dtype": "bfloat16"},
        "prompts": PROMPTS,
        "tokens": TOKENS,
    }
    policy = '{"dtype": "float16", "vllm": {"cpu_keep_weights": "on"}}'
    return run_program(
        "offline", config, tmp_path_factory.mktemp("plugin"), PRECISION_PLUGIN=policy
    )


@pytest.fixture(scope="module")
def excluded_engine(tied_model, tmp_path_factory) -> dict:
    config = {
        "model": tied_model,
        "engine_kwargs": "bfloat16",
        "prompts": PROMPTS,
        "tokens": TOKENS,
    }
    return run_program(
        "offline",
        config,
        tmp_path_factory.mktemp("excluded"),
        PRECISION_PLUGIN="float16",
        VLLM_PLUGINS="some_other_plugin",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # in this process: 10 s to start instead of 50
    )


def active_processes(log: str) -> set[str]:
    """The vLLM processes (name and pid prefix) that logged the plugin's activity line."""
    pattern = r"^\((\w+)(?:-\d+)? pid=(\d+)\).*precision_plugin active in this process"
    return {f"{m[0]}:{m[1]}" for m in re.findall(pattern, log, flags=re.M)}


def test_the_plugin_forces_the_policy_dtype_over_a_contradicting_dtype(plugin_engine):
    assert plugin_engine["dtype"] == "torch.float16"
    assert "dtype='bfloat16' contradicts the policy dtype float16" in plugin_engine["log"]
    assert plugin_engine["additional_config"] == {"precision_plugin": {"dtype": "float16"}}


def test_the_plugin_runs_in_every_engine_process(plugin_engine):
    """vLLM loads general plugins in its API/main process, the engine core and each worker."""
    names = sorted(p.split(":")[0] for p in active_processes(plugin_engine["log"]))
    assert names == ["EngineCore", "MainProcess", "VllmWorker"] or names == [
        "EngineCore",
        "MainProcess",
        "Worker",
    ], names


def test_cpu_keep_weights_on_reaches_every_engine_process(plugin_engine):
    log = plugin_engine["log"]
    assert (
        log.count("vLLM runs float16 (policy from PRECISION_PLUGIN); CPU Linear weights kept") == 3
    )


def test_verify_engine_ok_when_consistent_error_when_not(plugin_engine):
    fp16 = plugin_engine["verify"]["float16"]
    assert [s for s, _ in fp16] == ["ok"], fp16
    bf16 = plugin_engine["verify"]["bfloat16"]
    assert (
        bf16[0][0] == "error" and "runs torch.float16, but the learner runs bfloat16" in bf16[0][1]
    )


def test_the_cascade_guard_reads_the_live_engines_setting(plugin_engine):
    """vLLM 0.32 removed cascade attention: the guard drops the flag, and the live engine's
    model_config reads disable_cascade_attn=True (no cascade warning from verify_engine)."""
    from precision_plugin import PrecisionPolicy
    from precision_plugin.vllm import cascade_guard

    assert cascade_guard(PrecisionPolicy()).action == "drop_flag"
    assert plugin_engine["disable_cascade_attn"] is True
    assert "disable_cascade_attn" not in plugin_engine["kwargs"]


def test_vllm_plugins_without_the_plugin_leaves_vllm_alone(excluded_engine):
    assert not active_processes(excluded_engine["log"])
    assert excluded_engine["additional_config"] == {}
    # engine_kwargs alone made it bfloat16 although PRECISION_PLUGIN says float16.
    assert excluded_engine["kwargs"]["dtype"] == "bfloat16"
    assert excluded_engine["dtype"] == "torch.bfloat16"


def test_verify_engine_names_an_engine_the_plugin_never_reached(excluded_engine):
    statuses = excluded_engine["verify"]["float16"]
    assert statuses[0][0] == "error"
    assert statuses[-1][0] == "warning"
    assert "precision_plugin did not run inside the colocated vLLM engine" in statuses[-1][1]
    assert "Failed to load plugin precision_plugin" in statuses[-1][1]


def _k3(tied_model: str, engine: dict, dtype: str) -> tuple[float, int]:
    """k3 of the HF learner (the model in ``dtype``) against the engine on the engine's tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from precision_plugin._core.scoring import HFScorer, TokenSequence

    model = AutoModelForCausalLM.from_pretrained(tied_model, dtype=getattr(torch, dtype)).eval()
    sequences = [TokenSequence(tuple(s["prompt"]), tuple(s["tokens"])) for s in engine["samples"]]
    learner = HFScorer(model, batch_size=1).score(sequences)
    terms = [
        math.expm1(a - b) - (a - b)
        for s, row in zip(engine["samples"], learner, strict=True)
        for a, b in zip(row, s["logprobs"], strict=True)
    ]
    return sum(terms) / len(terms), len(terms)


def test_fp16_rollouts_match_the_learner_far_better_than_bf16(
    tied_model, plugin_engine, excluded_engine
):
    """The paper's picture from a real engine: 4 prompts x 64 sampled tokens each side, the HF
    learner in the engine's dtype scoring the engine's own tokens (raw log-probs, T=1)."""
    assert plugin_engine["logprobs_mode"] == "raw_logprobs"
    for engine in (plugin_engine, excluded_engine):
        assert all(math.isfinite(v) for s in engine["samples"] for v in s["logprobs"])
        assert all(len(s["tokens"]) == TOKENS for s in engine["samples"])
    fp16, n16 = _k3(tied_model, plugin_engine, "float16")
    bf16, n32 = _k3(tied_model, excluded_engine, "bfloat16")
    assert n16 == n32 == len(PROMPTS) * TOKENS
    assert 0 < fp16 < bf16 / 8, (fp16, bf16)
