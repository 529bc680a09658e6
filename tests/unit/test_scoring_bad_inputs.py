"""Bad input to the scoring and rollout entry points: one PrecisionConfigError each, naming what
was asked and what was found, never a deep traceback or a silently wrong number.

Covers ``bitwise_equal`` (float64 bits), ``batch_rescore`` (its ``alone`` rows and the scorer's
answer), ``HFScorer`` (sequences past ``max_position_embeddings``, a transform of the wrong
shape), ``HFRolloutEngine`` (a device this machine lacks, prompt ids, counts, seeds, a prompt
that fills the model's positions) and ``trainer_precision`` (a device this machine lacks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from precision_plugin._core.hf_engine import HFRolloutEngine, hf_engine_factory, load_causal_lm
from precision_plugin._core.scoring import HFScorer, TokenSequence, batch_rescore, bitwise_equal
from precision_plugin.errors import PrecisionConfigError
from tests.tiny import tiny_llama

#: The tiny model's limits: 64 token ids, 16 positions.
VOCAB, POSITIONS = 64, 16


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama(max_position_embeddings=POSITIONS).eval()


@pytest.fixture(scope="module")
def engine(model: Any) -> HFRolloutEngine:
    return HFRolloutEngine(model, "float32", "cpu")


# -- bitwise_equal ---------------------------------------------------------------------------


def test_bitwise_equal_compares_float64_bits() -> None:
    """Different float64 values are different bits, whatever float32 would round them to; a
    value past float32's range is compared like any other; -0.0 is not 0.0; NaN equals
    nothing; inf equals inf."""
    a = [[-0.1, 0.5, -0.0, math.nan, math.inf, -math.inf, 1e39], [1]]
    b = [[-0.1 + 1e-12, 0.5, 0.0, math.nan, math.inf, math.inf, 1e39], [1.0]]
    got = bitwise_equal(a, b)
    assert (got.equal, got.total) == (4, 8)  # 0.5, inf, 1e39 and 1 vs 1.0
    assert (bitwise_equal([[1.0 + 1e-12]], [[1.0]]).equal) == 0
    assert (bitwise_equal([[1e39, -1e39]], [[1e39, -1e39]]).equal) == 2
    # Values read off float32 tensors are exact in float64, so their count is unchanged: one
    # float32 ulp apart differ, the rest are equal.
    x = torch.randn(30, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[::3] = torch.nextafter(y[::3], torch.tensor(math.inf))
    got = bitwise_equal([x.tolist()], [y.tolist()])
    assert (got.equal, got.total) == (20, 30)
    assert got.equal == int((x.view(torch.int32) == y.view(torch.int32)).sum())


@pytest.mark.parametrize(
    ("a", "b", "where"),
    [
        ([[10**400]], [[1.0]], r"a\[0\]\[0\] is the integer 1000"),
        ([[1.0], [0.5, 2.0**53]], [[1.0], [0.5, 2**53 + 1]], r"b\[1\]\[1\] is the integer 9007"),
    ],
)
def test_bitwise_equal_refuses_an_integer_no_float64_holds(
    a: list[list[float]], b: list[list[float]], where: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=where + r".*no float64 holds exactly"):
        bitwise_equal(a, b)


def test_bitwise_equal_of_no_token_is_no_fraction() -> None:
    """Of no token, the fraction equal is NaN, not a 100 % all-clear (nor 0 %)."""
    got = bitwise_equal([[], []], [[], []])
    assert (got.equal, got.total) == (0, 0) and math.isnan(got.fraction)
    assert bitwise_equal([[0.5, 1.0]], [[0.5, 2.0]]).fraction == 0.5


def test_a_token_id_of_minus_one_is_refused() -> None:
    """-1 (a padding or "no token" marker in some pipelines) names no token: a scorer would
    read the last row of the vocabulary, a wrong log-prob and no error."""
    for prompt, completion in (((-1, 2), (3,)), ((1,), (3, -1))):
        with pytest.raises(PrecisionConfigError) as refused:
            TokenSequence(prompt, completion)
        assert str(refused.value) == (
            "TokenSequence(): token id -1 is negative; pass the tokenizer's ids (0 and up)."
        )
    assert TokenSequence((0,), (0,)).completion_ids == (0,)


# -- batch_rescore ---------------------------------------------------------------------------


SEQS = [TokenSequence((1, 2), (3, 4, 5)), TokenSequence((1,), (6, 7))]


class _Fixed:
    """A scorer that answers ``rows`` whatever it is asked."""

    def __init__(self, name: str, rows: list[list[float]]) -> None:
        self.name = name
        self.rows = rows

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        return self.rows


class _Exact:
    name = "exact"

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        return [[-1.0] * len(s.completion_ids) for s in sequences]


@pytest.mark.parametrize(
    ("alone", "message"),
    [
        ([[0.0] * 3], r"'sequences' and 'alone' differ in length \(sequences: 2, alone: 1\)"),
        ([[0.0] * 3, [0.0] * 3], r"alone\[1\] holds 3 log-probs, but sequences\[1\] has 2"),
    ],
)
def test_batch_rescore_checks_alone_against_sequences(
    alone: list[list[float]], message: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=message) as caught:
        batch_rescore(_Exact(), SEQS, 2, alone=alone)
    assert "bitwise_equal" not in str(caught.value)
    assert batch_rescore(_Exact(), SEQS, 2, alone=[[-1.0] * 3, [-1.0] * 2]).equal.equal == 5


@pytest.mark.parametrize(
    ("rows", "alone", "message"),
    [
        ([[0.0] * 3], [[0.0] * 3, [0.0] * 2], r"scorer 'short' returned 1 row\(s\) for 2 seq"),
        ([[0.0] * 2], None, r"scorer 'short' returned 2 log-probs for sequences\[0\], which has 3"),
        (None, None, r"scorer 'short' returned None for 1 sequence\(s\)"),
        # too many is as wrong as too few (a check of "fewer than" let the extra ones through)
        ([[0.0] * 4], None, r"scorer 'short' returned 4 log-probs for sequences\[0\], which has 3"),
    ],
)
def test_batch_rescore_names_a_scorer_that_answers_wrong(
    rows: list[list[float]] | None, alone: list[list[float]] | None, message: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=message):
        batch_rescore(_Fixed("short", rows), SEQS, 2, alone=alone)  # type: ignore[arg-type]


# -- HFScorer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("incremental", [False, True])
def test_hf_scorer_refuses_a_sequence_past_max_position_embeddings(
    model: Any, incremental: bool
) -> None:
    scorer = HFScorer(model, incremental=incremental, batch_size=2)
    fits = TokenSequence((1,) * 8, (3,) * 8)  # 16 tokens: the limit itself
    too_long = TokenSequence((1,) * 9, (3,) * 8)
    assert [len(r) for r in scorer.score([fits])] == [8]
    with pytest.raises(
        PrecisionConfigError,
        match=r"sequence 1 is 17 tokens long \(prompt 9 \+ completion 8\).*"
        r"max_position_embeddings=16",
    ):
        scorer.score([fits, too_long])


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize(
    ("transform", "found"),
    [
        (lambda logits, positions: logits[:, :10], r"shape \(3, 10\)"),  # wrong, not an error
        (lambda logits, positions: logits[:1], r"shape \(1, 64\)"),
        (lambda logits, positions: 3, r"returned 3 "),
    ],
)
def test_hf_scorer_checks_the_transforms_output_shape(
    model: Any, incremental: bool, transform: Any, found: str
) -> None:
    """Three positions per chunk, in one prefill forward or one decode step."""
    scorer = HFScorer(model, incremental=incremental, batch_size=3, transform=transform)
    seqs = [TokenSequence((1, 2), (3,)), TokenSequence((4,), (5,)), TokenSequence((6,), (7,))]
    with pytest.raises(
        PrecisionConfigError, match=rf"transform .* {found}.*logits of shape \(3, 64\)"
    ):
        scorer.score(seqs)


# -- HFRolloutEngine ---------------------------------------------------------------------------


def _missing_device() -> str:
    """A CUDA device this machine does not have (one past the last GPU, or any without one)."""
    return f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


def test_a_device_this_machine_lacks_is_one_clear_error(model: Any) -> None:
    device = _missing_device()
    calls = [
        lambda: HFRolloutEngine(model, "float32", device),
        lambda: load_causal_lm("unused", device),
        lambda: hf_engine_factory("unused", "float32", device, 0),
    ]
    for call in calls:
        with pytest.raises(
            PrecisionConfigError,
            match=rf"argument 'device' got '{device}', which cannot be used on this machine.*"
            r"pass 'cpu'",
        ):
            call()


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([[1, VOCAB]], rf"token id {VOCAB} in prompt 0 is past the model's {VOCAB} embeddings"),
        ([[1], [1, -3]], r"token id -3 in prompt 1 is negative"),
        ([[1, 2], []], r"prompt 1 is empty"),
    ],
)
def test_generate_names_a_bad_prompt(
    engine: HFRolloutEngine, prompts: list[list[int]], message: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=message):
        engine.generate(prompts, 2, 0)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 0), {}, r"argument 'max_new_tokens' got 0, which is out of range"),
        ((-1, 0), {}, r"argument 'max_new_tokens' got -1"),
        ((2, -1), {}, r"argument 'seed' got -1, which is out of range"),
        ((2, 0), {"min_new_tokens": -1}, r"argument 'min_new_tokens' got -1"),
    ],
)
def test_generate_refuses_counts_and_seeds_by_their_own_names(
    engine: HFRolloutEngine, args: tuple[int, int], kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(PrecisionConfigError, match=message) as caught:
        engine.generate([[1, 2]], *args, **kwargs)
    assert "budgets" not in str(caught.value)


def test_generate_bounds_are_exact(engine: HFRolloutEngine) -> None:
    """min_new_tokens up to max_new_tokens, and seeds while seed + prompt index fits torch's
    64 bits: one past either edge is refused, the edge itself samples."""
    with pytest.raises(PrecisionConfigError, match=r"min_new_tokens=3 is more than max_new_tok"):
        engine.generate([[1, 2]], 2, 0, min_new_tokens=3)
    got = engine.generate([[1, 2], [3]], 2, 0, min_new_tokens=2)
    assert [len(s.completion_ids) for s in got] == [2, 2]
    last = 2**64 - 1
    with pytest.raises(PrecisionConfigError, match=rf"seed {last} is too large.*2 prompt"):
        engine.generate([[1, 2], [3]], 1, last)
    with pytest.raises(PrecisionConfigError, match=rf"seed {last + 1} is too large"):
        engine.generate([[1, 2]], 1, last + 1)
    assert len(engine.generate([[1, 2], [3]], 1, last - 1)) == 2
    assert len(engine.generate([[VOCAB - 1]], 1, last)) == 1


def test_generate_stops_a_completion_at_max_position_embeddings(
    model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Prompt and completion stop at the model's 16 positions, as vLLM stops a request at
    max_model_len (positions past it were sampled and scored before): 16 in all is the limit
    itself, a longer one is cut there with a warning naming the limit (once per engine: a TRL
    run calls generate() every step); the other rows keep their caps; a prompt that leaves no
    room for a token is refused."""
    engine = HFRolloutEngine(model, "float32", "cpu")
    with caplog.at_level("WARNING", logger="precision_plugin"):
        got = engine.generate([[1] * 10, [2] * 4], 6, 0, min_new_tokens=6)
    assert [len(s.prompt_ids) + len(s.completion_ids) for s in got] == [16, 10]
    assert not caplog.records
    with caplog.at_level("WARNING", logger="precision_plugin"):
        got = engine.generate([[1] * 4, [2] * 11, [3] * 13], 6, 0, min_new_tokens=6)
    assert [len(s.completion_ids) for s in got] == [6, 5, 3]
    assert len(got[1].logprobs) == 5
    (record,) = caplog.records
    assert "2 prompt(s) would pass max_position_embeddings=16 before their 6 new tokens" in (
        record.getMessage()
    )
    assert "prompt 1, 11 tokens: at most 5 new tokens" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="precision_plugin"):
        again = engine.generate([[2] * 11], 6, 1)
    assert len(again[0].completion_ids) == 5 and not caplog.records
    with pytest.raises(PrecisionConfigError, match=r"prompt 0 is 16 tokens.*shorten it to fewer"):
        engine.generate([[1] * 16], 1, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_trainer_precision_refuses_a_device_this_machine_lacks() -> None:
    """torch's autocast on a missing CUDA device warns and runs float32: a float16 "trainer"
    that silently scored in float32. It is one error naming the device; the CPU still works."""
    from precision_plugin._core.scoring.hf import trainer_precision

    refused = pytest.raises(PrecisionConfigError, match=r"'device' got 'cuda'.*torch sees no CUDA")
    with refused, trainer_precision("float16", "cuda"):
        pass
    with trainer_precision("float16", "cpu"):
        assert torch.is_autocast_enabled("cpu")
