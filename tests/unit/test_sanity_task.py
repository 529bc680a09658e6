"""The sanity task and reward, the model builder, and the results schema."""

from __future__ import annotations

import json
import math

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sanity import DtypeRun, SanityConfig, SanityResult, StepRecord
from precision_plugin.sanity.model import MODEL_SIZES, build_model, build_tokenizer
from precision_plugin.sanity.schema import STEP_FIELDS, SUMMARY_FIELDS, missing_fields
from precision_plugin.sanity.task import (
    LETTERS,
    SEP,
    answer_of,
    make_problem,
    make_problems,
    reward_exact,
    score,
)


def test_problem_is_the_reversed_string():
    problem = make_problem("abcd")
    assert problem.prompt == "abcd" + SEP and problem.answer == "dcba"
    assert answer_of(problem.prompt) == "dcba"


def test_problems_are_distinct_seeded_and_in_range():
    first = make_problems(50, seed=3, min_len=3, max_len=5)
    assert first == make_problems(50, seed=3, min_len=3, max_len=5)
    assert first != make_problems(50, seed=4, min_len=3, max_len=5)
    assert len({p.prompt for p in first}) == 50
    for p in first:
        letters = p.prompt.removesuffix(SEP)
        assert 3 <= len(letters) <= 5 and set(letters) <= set(LETTERS)
        assert score(p.prompt, p.answer) == 1.0


def test_bad_problem_requests_are_refused():
    with pytest.raises(PrecisionConfigError, match="only"):
        make_problems(10_000, seed=0, min_len=1, max_len=2)
    with pytest.raises(PrecisionConfigError):
        make_problem("xyz")
    with pytest.raises(PrecisionConfigError):
        make_problems(0, seed=0)


def test_reward_is_binary_exact_match():
    prompts = ["abc>", "abc>", "abc>", "abc>", "fed>"]
    completions = ["cba", "c b a", "cb", "cbaa", "def"]
    assert reward_exact(prompts, completions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    chat = [[{"role": "user", "content": "ab>"}]]
    assert reward_exact(chat, [[{"role": "assistant", "content": "ba"}]]) == [1.0]


def test_tokenizer_round_trips_task_text_without_spaces():
    tokenizer = build_tokenizer()
    ids = tokenizer("cab>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 and min(ids) > 2  # one token per character, no special token
    with_eos = [*ids, tokenizer.eos_token_id]
    assert tokenizer.decode(with_eos, skip_special_tokens=True) == "cab>"


def test_model_sizes_build_deterministically():
    import torch

    a, _ = build_model("tiny", seed=1)
    b, _ = build_model("tiny", seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a.config.hidden_size == MODEL_SIZES["tiny"]["hidden_size"]
    with pytest.raises(PrecisionConfigError, match="model-size"):
        build_model("huge")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0},
        {"seed": -1},
        {"dtypes": "float16"},
        {"dtypes": ()},
        {"dtypes": ("fp8",)},
        {"model_size": "huge"},
        {"engine": "sglang"},
        {"num_generations": 1},
    ],
)
def test_config_refuses_bad_input(kwargs):
    with pytest.raises(PrecisionConfigError):
        SanityConfig(**kwargs)


def test_config_normalizes_dtype_aliases():
    assert SanityConfig(dtypes=("fp16", "bf16", "fp16")).dtypes == ("float16", "bfloat16")


def _run(dtype: str, k3: float, nan: bool = False) -> DtypeRun:
    steps = [
        StepRecord(
            step=i,
            reward=0.5,
            accuracy=0.25 * i,
            k3_kl=float("nan") if nan and i == 2 else k3 * i,
            prob_diff_max=0.01,
            loss_scale=65536.0 if dtype == "float16" else None,
            skipped_steps=0.0 if dtype == "float16" else None,
        )
        for i in (1, 2, 3)
    ]
    return DtypeRun(dtype=dtype, steps=steps, seconds=1.0)


def test_result_summary_ratio_and_json_have_every_field():
    runs = {"float16": _run("float16", 1e-6), "bfloat16": _run("bfloat16", 1e-4, nan=True)}
    result = SanityResult(
        config=SanityConfig(dtypes=("float16", "bfloat16")),
        pretrain={"steps": 1, "sampled_accuracy": 0.3},
        model={"parameters": 1},
        runs=runs,
    )
    for run in runs.values():
        run.summarize()
    fp16 = runs["float16"].summary
    assert fp16["mean_k3_kl"] == pytest.approx(2e-6)
    assert (fp16["first_accuracy"], fp16["peak_accuracy"]) == (0.25, 0.75)
    assert fp16["final_loss_scale"] == 65536.0 and fp16["nan_values"] == 0
    bf16 = runs["bfloat16"].summary
    assert bf16["nan_values"] == 1 and bf16["mean_k3_kl"] == pytest.approx(2e-4)  # NaN left out
    assert result.k3_ratio_bf16_over_fp16 == pytest.approx(100.0)
    data = json.loads(result.to_json())  # strict JSON: the NaN is null
    assert missing_fields(data) == []
    assert data["runs"]["bfloat16"]["steps"][1]["k3_kl"] is None
    assert set(data["runs"]["float16"]["summary"]) == set(SUMMARY_FIELDS)
    assert set(data["runs"]["float16"]["steps"][0]) == set(STEP_FIELDS)
    assert data["config"]["dtypes"] == ["float16", "bfloat16"]
    del data["runs"]["float16"]["steps"][0]["k3_kl"]
    assert missing_fields(data) == ["runs.float16.steps[0].k3_kl"]


def test_ratio_is_none_without_both_half_dtypes():
    result = SanityResult(
        config=SanityConfig(dtypes=("float16",)),
        pretrain={},
        model={},
        runs={"float16": _run("float16", 1e-6)},
    )
    assert result.k3_ratio_bf16_over_fp16 is None
    assert not math.isnan(json.loads(result.to_json())["runs"]["float16"]["summary"]["seconds"])
