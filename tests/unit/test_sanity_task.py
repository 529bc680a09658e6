"""The sanity tasks and reward, the model builder, the configuration and presets."""

from __future__ import annotations

import random
import string

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sanity import PRESETS, SanityConfig, preset_config
from precision_plugin.sanity.model import MODEL_SIZES, build_model, build_tokenizer
from precision_plugin.sanity.schema import SMOKE
from precision_plugin.sanity.task import REVERSE, SEP, SHIFT, ReverseTask, ShiftTask


# -- reverse (default preset) --------------------------------------------------------------------
def test_problem_is_the_reversed_string():
    problem = REVERSE.make_problem("abcd")
    assert problem.prompt == "abcd" + SEP and problem.answer == "dcba"
    assert REVERSE.answer_of(problem.prompt) == "dcba"


def test_problems_are_distinct_seeded_and_in_range():
    task = ReverseTask(letters="abcdef", min_len=3, max_len=5)
    first = task.make_problems(50, seed=3)
    assert first == task.make_problems(50, seed=3)
    assert first != task.make_problems(50, seed=4)
    assert len({p.prompt for p in first}) == 50
    for p in first:
        letters = p.prompt.removesuffix(SEP)
        assert 3 <= len(letters) <= 5 and set(letters) <= set("abcdef")
        assert task.score(p.prompt, p.answer) == 1.0


def test_bad_problem_requests_are_refused():
    with pytest.raises(PrecisionConfigError, match="only 42 exist"):
        ReverseTask(letters="abcdef", min_len=1, max_len=2).make_problems(10_000, seed=0)
    with pytest.raises(PrecisionConfigError, match="not a non-empty string"):
        REVERSE.make_problem("xyz")
    with pytest.raises(PrecisionConfigError, match="count"):
        REVERSE.make_problems(0, seed=0)
    with pytest.raises(PrecisionConfigError, match="min_len"):
        ReverseTask(letters="ab", min_len=3, max_len=2)
    with pytest.raises(PrecisionConfigError, match="distinct"):
        ReverseTask(letters="aab")


def test_reward_is_binary_exact_match():
    reward = REVERSE.reward_function()
    assert reward.__name__ == "reward_exact"  # TRL logs rewards/reward_exact/mean
    prompts = ["abc>", "abc>", "abc>", "abc>", "fed>"]
    completions = ["cba", "c b a", "cb", "cbaa", "def"]
    assert reward(prompts, completions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    chat = [[{"role": "user", "content": "ab>"}]]
    assert reward(chat, [[{"role": "assistant", "content": "ba"}]]) == [1.0]


# -- shift (long preset) -------------------------------------------------------------------------
def _rule_holds(key: str, answer: str, period: int, shifts: set[int]) -> bool:
    """The rule, checked independently: letter i is letter i - period shifted by one of shifts."""
    seq = key + answer
    az = string.ascii_lowercase
    return all(
        (az.index(seq[i]) - az.index(seq[i - period])) % 26 in shifts
        for i in range(period, len(seq))
    )


def test_shift_answer_continues_the_key_with_the_first_shift():
    task = ShiftTask(letters=string.ascii_lowercase, period=3, answer_len=7, shifts=(3, 4))
    # a b c -> d e f -> g h i -> j (each letter 3 places after the one 3 back)
    assert task.answer_of("abc") == "defghij"
    wrapped = task.answer_of("xyz")
    assert wrapped == "abcdefg"  # x+3 wraps to a
    assert task.max_prompt_tokens == 3 and task.max_completion_tokens == 7
    assert task.max_positions == 10 and not task.ends_with_eos


def test_shift_reward_checks_the_rule_not_one_answer():
    task = ShiftTask(letters=string.ascii_lowercase, period=2, answer_len=4, shifts=(3, 4))
    # key "aa": +3/+4 chains -> "de", then +3/+4 of d/e
    assert task.score("aa", "dehi") == 1.0  # a+3, a+4, d+4, e+4
    assert task.score("aa", "eehi") == 1.0  # a+4, a+4, e+3, e+4
    assert task.score("aa", "eegh") == 0.0  # e+2
    assert task.score("aa", "dfhi") == 0.0  # a+5
    assert task.score("aa", "deh") == 0.0  # too short
    assert task.score("aa", "dehij") == 0.0  # too long
    assert task.score("aa", "de>i") == 0.0  # not a letter
    assert task.score("aa", "d e h i") == 1.0  # whitespace ignored


def test_shift_sampled_answers_follow_the_rule_and_use_every_shift():
    rng = random.Random(0)
    key = SHIFT.draw(rng)
    answers = [SHIFT.sample_answer(key, rng) for _ in range(20)]
    assert all(len(a) == 96 and _rule_holds(key, a, 8, {3, 4}) for a in answers)
    assert all(SHIFT.score(key, a) == 1.0 for a in answers)
    steps = {
        (string.ascii_lowercase.index(b) - string.ascii_lowercase.index(a)) % 26
        for answer in answers
        for a, b in zip(key + answer, answer, strict=False)
    }
    assert steps == {3, 4}
    assert len(set(answers)) == 20  # a free choice at every letter


def test_shift_problems_are_seeded_keys():
    problems = SHIFT.make_problems(64, seed=1)
    assert problems == SHIFT.make_problems(64, seed=1)
    assert all(
        len(p.prompt) == 8 and set(p.prompt) <= set(string.ascii_lowercase) for p in problems
    )
    assert len({p.prompt for p in problems}) == 64


def test_bad_shift_tasks_are_refused():
    for kwargs in ({"shifts": (26,)}, {"shifts": (3, 29)}, {"shifts": ()}, {"period": 0}):
        with pytest.raises(PrecisionConfigError, match="shifts"):
            ShiftTask(letters=string.ascii_lowercase, **kwargs)
    with pytest.raises(PrecisionConfigError, match="period is 8"):
        SHIFT.make_problem("abc")


# -- tokenizer and model -------------------------------------------------------------------------
def test_tokenizer_round_trips_task_text_without_spaces():
    tokenizer = build_tokenizer()
    ids = tokenizer("cab>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 and min(ids) > 2  # one token per character, no special token
    with_eos = [*ids, tokenizer.eos_token_id]
    assert tokenizer.decode(with_eos, skip_special_tokens=True) == "cab>"


def test_long_task_vocabulary_is_the_alphabet_plus_four():
    tokenizer = build_tokenizer(SHIFT)
    assert len(tokenizer) == 30  # 26 letters, ">", pad, bos, eos
    ids = tokenizer("xyzabc", add_special_tokens=False)["input_ids"]
    assert ids == [3 + 23, 3 + 24, 3 + 25, 3, 4, 5]


def test_model_sizes_build_deterministically():
    import torch

    a, _ = build_model("tiny", seed=1)
    b, _ = build_model("tiny", seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a.config.hidden_size == MODEL_SIZES["tiny"]["hidden_size"]
    long, _ = build_model("tiny", seed=1, task=SHIFT)
    assert long.config.vocab_size == 30 and long.config.max_position_embeddings == 104
    with pytest.raises(PrecisionConfigError, match="model-size"):
        build_model("huge")


# -- configuration and presets -------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0},
        {"seeds": (-1,)},
        {"seeds": (1, 1)},
        {"seeds": ()},
        {"seeds": "0"},
        {"dtypes": "float16"},
        {"dtypes": ()},
        {"dtypes": ("fp8",)},
        {"model_size": "huge"},
        {"engine": "sglang"},
        {"num_generations": 1},
        {"learning_rate": 0},
        {"pretrain_target": 1.5},
        {"loss_type": "sapo"},
        {"preset": "huge"},
    ],
)
def test_config_refuses_bad_input(kwargs):
    with pytest.raises(PrecisionConfigError):
        SanityConfig(**kwargs)


def test_config_normalizes_dtype_aliases():
    assert SanityConfig(dtypes=("fp16", "bf16", "fp16")).dtypes == ("float16", "bfloat16")


def test_presets_and_smoke_variants():
    default = preset_config()
    assert (default.steps, default.seeds, default.task) == (60, (0,), REVERSE)
    assert not default.grad_cosine and default.window == 10
    long = preset_config("long")
    assert long.task is SHIFT and long.grad_cosine and long.seeds == (0, 1, 2)
    assert long.steps == 300 and long.window == 50 and long.temperature == 1.0
    assert {k: getattr(long, k) for k in PRESETS["long"]} == PRESETS["long"]
    smoke = preset_config("long", smoke=True, seeds=None, learning_rate=3e-4)
    assert smoke.smoke and smoke.seeds == SMOKE["long"]["seeds"] and smoke.learning_rate == 3e-4
    assert smoke.model_size == "tiny" and smoke.grad_cosine
    assert preset_config("default", smoke=True).steps == 6
    with pytest.raises(PrecisionConfigError, match="unknown settings"):
        preset_config("long", bogus=1)
    with pytest.raises(PrecisionConfigError, match="preset"):
        preset_config("huge")
