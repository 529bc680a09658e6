"""probe --attribute: each cause injected alone is ranked first; the decomposition arithmetic;
--rollout parsing; the first setting to change. Tiny models built in code, CPU only."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.attribution import (
    RolloutSettings,
    attribute_dtype,
    decompose,
    first_change,
    parse_rollout,
    rollout_samples,
)
from tests.tiny import tiny_llama

PROMPTS = [[5, 9, 17, 3, 22, 40], [7, 7, 31, 2], [11, 60, 33, 8, 1]]
NEW_TOKENS = 24


def _run(model: Any, dtype: str, settings: RolloutSettings, *, prompts: list[list[int]] = PROMPTS,
         learning_rate: float | None = None, seed: int = 0) -> Any:  # fmt: skip
    samples = rollout_samples(
        model, prompts, [NEW_TOKENS] * len(prompts), dtype, settings,
        max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, seed=seed,
    )  # fmt: skip
    return attribute_dtype(
        model, samples, dtype, settings,
        min_new_tokens=NEW_TOKENS, learning_rate=learning_rate, seed=seed, what_if=False,
    )  # fmt: skip


def _ranking(report: Any) -> list[tuple[str, float]]:
    return [(r.cause, r.k3.value) for r in report.ranked()]


def _llama() -> Any:
    # Wider init than HF's 0.02: peaked next-token distributions, where rounding shows.
    return tiny_llama(num_hidden_layers=2, initializer_range=0.2).eval()


def _moe() -> Any:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, max_position_embeddings=128,
        initializer_range=0.2,
    )  # fmt: skip
    return Qwen2MoeForCausalLM(config).eval()


class _BatchDependentNorm:
    """A controlled engine: the final norm's output is rounded to bfloat16 whenever more than
    one sequence shares the forward (a batch-dependent kernel), never for a sequence alone."""

    def __call__(self, module: Any, args: Any, output: Any) -> Any:
        return output.to(torch.bfloat16).float() if output.shape[0] > 1 else output


# Causes that exist only relative to a compute dtype are injected under float32 compute with only
# that component rounded; the others in the setting that shows them. Each run: 3 prompts x 24
# tokens (decode: 1 prompt), seed 0. The injected cause's k3 over the next row's, measured with
# AVX2 and with ATEN_CPU_CAPABILITY=default (SSE4.1): dtype 13x (bfloat16 vs decode), every other
# cause > 1e5x (the others are float32 noise or exactly 0); the bound 3 keeps >= 4x room.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dtype": ("bfloat16", {}),
    "decode": ("float32", {}),
    "batch": ("float32", {}),
    "lm_head": ("float32", {"lm_head_dtype": "bfloat16"}),
    "sampling": ("float32", {"temperature": 0.7}),
    "rope": ("float32", {"rope_dtype": "bfloat16"}),
    "kv_cache": ("float32", {"kv_cache_dtype": "fp8_e4m3"}),
    "router": ("float32", {"router_dtype": "bfloat16"}),
    "stale_weights": ("float32", {}),
}


@pytest.mark.parametrize("cause", list(CASES))
def test_an_injected_cause_is_ranked_first(cause: str) -> None:
    dtype, switches = CASES[cause]
    model = _moe() if cause == "router" else _llama()
    prompts = PROMPTS
    if cause == "decode":
        prompts = PROMPTS[:1]  # alone: no batch row, so float32 decode noise is the only cause
    if cause == "batch":
        model.model.norm.register_forward_hook(_BatchDependentNorm())
    lr = 1e-3 if cause == "stale_weights" else None
    report = _run(model, dtype, RolloutSettings(**switches), prompts=prompts, learning_rate=lr)
    ranking = _ranking(report)
    assert ranking[0][0] == cause, ranking
    top, runner_up = ranking[0][1], (ranking[1][1] if len(ranking) > 1 else 0.0)
    assert top > 3 * runner_up, ranking
    row = report.row(cause)
    if cause != "stale_weights":
        assert row is not None and row.in_total and row.share is not None
        assert row.share > 0.5, (row.share, ranking)
    if cause == "router":
        # 87 positions (15 prompt + 72 sampled) x 2 layers routed; one choice flips (the same
        # with AVX2 and with ATEN_CPU_CAPABILITY=default).
        assert row.expert_flips == 1 / 174


def test_float32_without_causes_has_dtype_exactly_zero_and_shares_summing_to_one() -> None:
    report = _run(_llama(), "float32", RolloutSettings())
    dtype_row = report.row("dtype")
    # The same weights and code on both sides in float32: bit-identical, exactly.
    assert dtype_row.k3.value == 0.0 and dtype_row.bitwise_equal == 1.0
    shares = [r.share for r in report.rows if r.in_total]
    total = sum(shares) + (report.interaction + report.residual) / report.total_part
    assert total == pytest.approx(1.0, abs=1e-12)


def test_decomposition_arithmetic_is_exact() -> None:
    # d = [5, 0]; d_a = [1, 2]; d_b = [3, -1]; S = [4, 1]. Over n = 2 tokens:
    # total = (25 + 0) / 4 = 6.25; a = (1 + 4) / 4 = 1.25; b = (9 + 1) / 4 = 2.5;
    # interaction = E[d_a d_b] = (3 - 2) / 2 = 0.5; residual = (25 - 17) / 4 = 2.0.
    split = decompose([[5.0], [0.0]], {"a": [[1.0], [2.0]], "b": [[3.0], [-1.0]]})
    assert split.total == 6.25
    assert split.parts == {"a": 1.25, "b": 2.5}
    assert split.interaction == 0.5
    assert split.residual == 2.0
    assert split.parts["a"] + split.parts["b"] + split.interaction + split.residual == split.total
    assert split.share(split.parts["b"]) == 0.4


def test_decomposition_refuses_other_tokens() -> None:
    with pytest.raises(PrecisionConfigError, match="same tokens"):
        decompose([[1.0, 2.0]], {"a": [[1.0]]})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("top_q=0.9", ["unknown key 'top_q'", "top_p", "kv_cache_dtype"]),
        ("top_p=2", ["top_p", "(0, 1]"]),
        ("top_p=abc", ["top_p='abc'", "a number"]),
        ("top_k=1.5", ["top_k='1.5'", "whole number"]),
        ("kv_cache_dtype=int8", ["kv_cache_dtype='int8'", "fp8_e4m3"]),
        ("logprobs_mode=processed", ["logprobs_mode='processed'", "processed_logprobs"]),
        ("lm_head_fp32=maybe", ["lm_head_fp32='maybe'", "true or false"]),
        ("temperature", ["not KEY=VALUE", "--rollout top_p=0.9"]),
        ("top_p=0.9,top_p=0.8", ["'top_p' is given twice"]),
    ],
)
def test_rollout_bad_input_names_the_key_and_the_fix(text: str, words: list[str]) -> None:
    with pytest.raises(PrecisionConfigError) as info:
        parse_rollout(text)
    message = str(info.value)
    assert message.startswith("--rollout: ")
    for word in words:
        assert word in message


def test_rollout_parses_vllm_names() -> None:
    got = parse_rollout("top_p=0.9, logprobs_mode=processed_logprobs,kv_cache_dtype=fp8,"
                        "lm_head_fp32=true,top_k=-1,temperature=0.8")  # fmt: skip
    assert got == RolloutSettings(
        temperature=0.8, top_p=0.9, top_k=-1, logprobs_mode="processed_logprobs",
        kv_cache_dtype="fp8", lm_head_fp32=True,
    )  # fmt: skip
    assert got.kv_format == "float8_e4m3fn" and got.head_dtype == "float32"


def test_first_change_is_the_largest_settable_cause_in_a_total() -> None:
    rows = {
        "float16": {
            "dtype": {"share": 0.5, "k3": 1e-5, "in_total": True},  # float16 is the remedy
            "decode": {"share": 0.9, "k3": 2e-5, "in_total": True},  # no setting removes it
            "sampling": {"share": 0.3, "k3": 3e-3, "in_total": True},
            "kv_cache": {"share": None, "k3": 2e-2, "in_total": False},  # a what-if
        },
        "bfloat16": {"kv_cache": {"share": 0.2, "k3": math.nan, "in_total": True}},
    }
    got = first_change(rows)
    assert got is not None and (got.dtype, got.cause, got.share) == ("float16", "sampling", 0.3)
    assert "top_p" in got.line()
    assert first_change({"float16": {"decode": rows["float16"]["decode"]}}) is None


def test_probe_attribute_with_rollout_settings_writes_the_section(
    tmp_path: Any, capsys: Any
) -> None:
    import json

    from precision_plugin.cli import main

    out = tmp_path / "probe.json"
    code = main([
        "probe", "--num-prompts", "2", "--max-new-tokens", "12", "--min-new-tokens", "12",
        "--dtypes", "float32,bfloat16", "--rollout",
        "top_p=0.9,logprobs_mode=processed_logprobs,kv_cache_dtype=fp8_e4m3",
        "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    section = data["attribution"]
    assert data["settings"]["attribute"] is True
    assert section["rollout"]["kv_cache_dtype"] == "fp8_e4m3"
    block = section["dtypes"]["bfloat16"]
    in_total = [c for c, row in block["causes"].items() if row["in_total"]]
    assert in_total == ["dtype", "decode", "batch", "sampling", "kv_cache"]
    shares = sum(block["causes"][c]["share"] for c in in_total)
    shares += block["interaction"]["share"] + block["residual"]["share"]
    assert shares == pytest.approx(1.0, abs=1e-9)
    assert block["causes"]["stale_weights"]["in_total"] is False
    assert "VLLM_BATCH_INVARIANT=1" in block["causes"]["batch"]["fixes"]["vLLM"]
    assert section["first_change"]["cause"] in ("kv_cache", "sampling")
    printed = capsys.readouterr().out
    assert "why it is still off" in printed and "change first" in printed


def test_probe_bad_rollout_is_one_usage_error(capsys: Any) -> None:
    from precision_plugin.cli import main

    assert main(["probe", "--rollout", "top_q=0.9"]) == 2
    err = capsys.readouterr().err
    assert "--rollout: unknown key 'top_q'" in err and "Traceback" not in err
