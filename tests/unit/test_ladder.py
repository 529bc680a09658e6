"""The precision ladder: level 2 and 3 certified on an engine that is batch-invariant (HF at batch
size 1) and refused on one that pads sequences into batches; the level rule itself.

A 2-layer Llama built in code; 8 canary sequences of different lengths, scored in bfloat16.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from precision_plugin._core.canary.ladder import (
    Invariance,
    certify_batch_invariance,
    precision_level,
)
from precision_plugin._core.hf_engine import HFRolloutEngine
from precision_plugin._core.scoring import BatchRescore, BitwiseEqual, HFScorer, TokenSequence

VOCAB = 64


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return _tiny_llama()


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _canary() -> list[TokenSequence]:
    rng = random.Random(0)
    return [
        TokenSequence(
            tuple(rng.randrange(3, VOCAB) for _ in range(3 + 2 * i)),
            tuple(rng.randrange(3, VOCAB) for _ in range(12 - i)),
        )
        for i in range(8)
    ]


class _PaddingLeaks:
    """A scorer whose rows depend on their batch: each row's log-probs move by ``1e-6`` per
    position it is padded by (its batch's longest completion against its own)."""

    name = "padding-leaks"

    def __init__(self, scorer: HFScorer) -> None:
        self.scorer = scorer

    def score(self, sequences: list[TokenSequence]) -> list[list[float]]:
        rows = self.scorer.score(sequences)
        width = max(len(s.completion_ids) for s in sequences)
        return [[x + 1e-6 * (width - len(row)) for x in row] for row in rows]


def _generate_alone(engine: HFRolloutEngine):
    def generate(prompts: list[list[int]], max_new: int, seed: int):
        return [engine.generate([p], max_new, seed + i)[0] for i, p in enumerate(prompts)]

    return generate


def test_batch_one_engine_is_certified_and_a_padding_engine_is_not(model) -> None:
    engine = HFRolloutEngine(model, "bfloat16", "cpu")
    canary = _canary()
    invariant = certify_batch_invariance(
        HFScorer(engine.model, batch_size=1), canary, 8, generate=_generate_alone(engine)
    )
    assert invariant.certified, invariant.summary()
    assert invariant.rescore.equal == BitwiseEqual(68, 68)  # 12 + 11 + ... + 5 tokens
    assert invariant.same_tokens and invariant.generated.fraction == 1.0

    # An engine that pads: whether real kernels make a row depend on its padded batch varies
    # with the CPU (plain PyTorch bfloat16 did on an AVX512 CPU, 46 of 68 log-probs equal; not
    # at the SSE4.1 floor, nor with the engine's own kernels on this model). So the padding
    # engine is planted: the HF scorer's batches of 8, with each row's log-probs moved by 1e-6
    # per padded position, as a kernel reducing over the padded width would, on every CPU.
    padded = certify_batch_invariance(
        _PaddingLeaks(HFScorer(engine.model, batch_size=8)), canary, 8
    )
    assert not padded.certified
    # only the longest sequence (12 tokens) is unpadded in the one batch of 8
    assert padded.rescore.equal.total == 68 and padded.rescore.equal.equal <= 12, padded.summary()


def test_level_three_needs_train_equal_to_rollout_bit_for_bit(model) -> None:
    # The engine takes the learner itself (no copy): train and rollout are one float32 model.
    engine = HFRolloutEngine(model, "float32", "cpu", copy=False)
    canary = _canary()
    rollout = HFScorer(engine.model, batch_size=1)
    invariance = certify_batch_invariance(rollout, canary, 8)
    assert invariance.certified
    same = HFScorer(model, batch_size=1)  # the learner, float32 as the rollout copy
    equal = BitwiseEqual(68, 68)
    from precision_plugin._core.scoring import bitwise_equal

    assert bitwise_equal(same.score(canary), rollout.score(canary)) == equal
    assert precision_level(True, invariance, 1.0, 1.0) == 3
    autocast = HFScorer(model, batch_size=1, autocast="bfloat16")  # a bf16 autocast learner
    frac = bitwise_equal(autocast.score(canary), rollout.score(canary)).fraction
    assert frac < 1.0
    assert precision_level(True, invariance, frac, 1.0) == 2


def _invariance(equal: int, total: int) -> Invariance:
    rescore = BatchRescore(8, [[0.0]] * total, [[0.0]] * total, BitwiseEqual(equal, total))
    return Invariance(rescore, None, None)


@pytest.mark.parametrize(
    ("one_dtype", "invariance", "canary", "batch", "level"),
    [
        (False, _invariance(4, 4), 1.0, 1.0, 0),
        (True, None, 1.0, 1.0, 1),
        (True, _invariance(3, 4), 1.0, 1.0, 1),
        (True, _invariance(0, 0), 1.0, 1.0, 1),
        (True, _invariance(4, 4), 0.5, 1.0, 2),
        (True, _invariance(4, 4), 1.0, None, 2),
        (True, _invariance(4, 4), 1.0, math.nan, 2),
        (True, _invariance(4, 4), 1.0, 1.0, 3),
    ],
)
def test_level_rule(one_dtype, invariance, canary, batch, level) -> None:
    assert precision_level(one_dtype, invariance, canary, batch) == level
