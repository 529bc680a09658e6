"""The core scoring pieces: bitwise-equal metric, HF scorer (prefill and decode), batch rescore."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from precision_plugin._core.scoring import (
    HFScorer,
    Scorer,
    TokenSequence,
    batch_rescore,
    bitwise_equal,
)
from precision_plugin.errors import PrecisionConfigError
from tests.tiny import tiny_llama


def test_bitwise_equal_counts_float64_bits() -> None:
    got = bitwise_equal([[0.5, -0.0, math.nan], [1.0]], [[0.5, 0.0, math.nan], [1.0 + 1e-12]])
    # 0.5 equal; -0.0 vs 0.0 differ in bits; NaN equals nothing; 1.0 + 1e-12 is another float
    # (packed as float32 it was "equal": the values differ, so they are not bit-identical).
    assert (got.equal, got.total) == (1, 4)
    assert got.fraction == 0.25


def test_bitwise_equal_refuses_different_shapes() -> None:
    with pytest.raises(PrecisionConfigError, match="same tokens"):
        bitwise_equal([[0.0, 1.0]], [[0.0]])


def _sequences() -> list[TokenSequence]:
    gen = torch.Generator().manual_seed(3)
    return [
        TokenSequence(
            tuple(torch.randint(3, 64, (p,), generator=gen).tolist()),
            tuple(torch.randint(3, 64, (c,), generator=gen).tolist()),
        )
        for p, c in ((5, 7), (3, 9), (6, 4))
    ]


def test_hf_scorer_decode_matches_prefill_in_float32() -> None:
    model = tiny_llama(num_hidden_layers=2).eval()
    seqs = _sequences()
    prefill = HFScorer(model).score(seqs)
    decode = HFScorer(model, incremental=True, batch_size=3).score(seqs)
    assert [len(r) for r in prefill] == [7, 9, 4]
    assert isinstance(HFScorer(model), Scorer)
    # The same function computed two ways: float32 rounding apart (|logp| ~ 4 here).
    flat = [
        (a, b) for ra, rb in zip(prefill, decode, strict=True) for a, b in zip(ra, rb, strict=True)
    ]
    worst = max(abs(a - b) for a, b in flat)
    assert worst < 1e-4


class _BatchDependent:
    """A controlled scorer whose numbers change when more than one sequence shares the call."""

    name = "controlled"

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        shift = 0.0 if len(sequences) == 1 else 1e-3
        return [[-1.0 - shift * (i % 2) for i in range(len(s.completion_ids))] for s in sequences]


def test_batch_rescore_finds_a_batch_dependent_engine() -> None:
    seqs = _sequences()
    got = batch_rescore(_BatchDependent(), seqs, batch_size=3)
    # Odd positions move inside a batch: 3 + 4 + 2 of the 20 tokens, even ones stay equal.
    assert (got.equal.equal, got.equal.total) == (11, 20)
    assert got.max_abs_diff == pytest.approx(1e-3)
    alone = batch_rescore(_BatchDependent(), seqs, batch_size=1)
    assert alone.equal.fraction == 1.0


def test_batch_rescore_of_the_hf_scorer_runs_alone_and_batched() -> None:
    model = tiny_llama().eval()
    seqs = _sequences()
    got = batch_rescore(HFScorer(model, batch_size=3), seqs, batch_size=3, seed=1)
    assert got.equal.total == 20
    assert got.alone == HFScorer(model).score(seqs)
    assert got.max_abs_diff < 1e-4  # left padding hides the pads; float32 rounding at most


def test_token_sequences_a_scorer_cannot_read_are_refused() -> None:
    """An empty prompt (the first completion token would be read off another position's
    logits), a negative id, and an id past the model's embeddings: one message each."""
    with pytest.raises(PrecisionConfigError, match=r"prompt_ids is empty.*at least one prompt"):
        TokenSequence((), (3,))
    with pytest.raises(PrecisionConfigError, match=r"token id -2 is negative"):
        TokenSequence((1,), (-2,))
    model = tiny_llama(num_hidden_layers=1).eval()
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(
        PrecisionConfigError, match=rf"token id {vocab} is past the model's {vocab}"
    ):
        HFScorer(model).score([TokenSequence((1,), (vocab,))])
    assert HFScorer(model).score([TokenSequence((1,), ())]) == [[]]
