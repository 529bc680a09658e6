"""Prompts of different lengths in one left-padded batch, and EOS suppression, on both paths."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from precision_plugin._core.hf_engine import HFRolloutEngine, hf_engine_factory
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe import ProbeConfig, run_probe
from precision_plugin.probe.scoring import trainer_logprobs
from tests.kernels import THRESHOLDS

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [20], [30, 31, 32, 33, 34]]
EOS = 2


def _model(family: str = "llama", eos_boost: float = 0.0) -> Any:
    """A tiny random model; ``eos_boost`` adds to the EOS logit (a model that ends early)."""
    import transformers as tf

    extra = {"gemma2": {"head_dim": 16, "sliding_window": 8}}.get(family, {})
    cls = {"llama": tf.LlamaConfig, "gemma2": tf.Gemma2Config}[family]
    config = cls(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
        **extra,
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    if eos_boost:

        def boost(module: Any, args: Any, out: Any) -> Any:
            out = out.clone()
            out[..., EOS] += eos_boost
            return out

        model.get_output_embeddings().register_forward_hook(boost)
    return model


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_a_left_padded_batch_equals_the_prompts_run_one_by_one(family: str) -> None:
    engine = HFRolloutEngine(_model(family), "float32", "cpu")
    batched = engine.generate(PROMPTS, 24, seed=7)
    # Prompt i samples from seed + i, whatever else is in the batch.
    single = [engine.generate([p], 24, seed=7 + i)[0] for i, p in enumerate(PROMPTS)]
    assert [s.prompt_ids for s in batched] == PROMPTS  # the padding is not part of the prompt
    for a, b in zip(batched, single, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_row_stops_at_its_budget_and_leaves_the_batch(dtype: str) -> None:
    """budgets: each row samples exactly its own cap (as vLLM's max_tokens per request) and
    the finished rows leave the batch; what each row sampled is what the full run sampled up
    to its cap (4 prompts x caps 3..24: the same tokens, log-probs within the kernels' row-count
    noise), and the decode scorer, dropping rows at the same steps, reproduces it bit for bit."""
    from precision_plugin._core.scoring import HFScorer, sequences_of

    engine = HFRolloutEngine(_model(), dtype, "cpu")
    caps = [3, 24, 9, 17]
    full = engine.generate(PROMPTS, 24, seed=5)
    capped = engine.generate(PROMPTS, 24, seed=5, budgets=caps)
    assert [len(s.completion_ids) for s in full] == [24] * 4  # no EOS in 24 tokens here
    assert [len(s.completion_ids) for s in capped] == caps
    for a, b, cap in zip(full, capped, caps, strict=True):
        assert b.completion_ids == a.completion_ids[:cap]
        assert b.logprobs == pytest.approx(a.logprobs[:cap], abs=1e-4)
    decoded = HFScorer(engine.model, batch_size=4, incremental=True).score(sequences_of(capped))
    assert decoded == [s.logprobs for s in capped]
    with pytest.raises(PrecisionConfigError, match=r"budgets=.*one whole number from 1 to"):
        engine.generate(PROMPTS, 24, seed=5, budgets=[3, 25, 9, 17])
    with pytest.raises(PrecisionConfigError, match=r"per prompt \(4\)"):
        engine.generate(PROMPTS, 24, seed=5, budgets=[3])


def test_left_padded_rollout_and_unpadded_trainer_agree_in_float32() -> None:
    model = _model()
    samples = HFRolloutEngine(_model(), "float32", "cpu").generate(PROMPTS, 24, seed=3)
    train = trainer_logprobs(model, samples, "float32", "cpu")
    for sample, row in zip(samples, train, strict=True):
        assert row == pytest.approx(sample.logprobs, abs=1e-5)


def test_min_new_tokens_suppresses_eos_and_keeps_the_unmasked_logprob() -> None:
    engine = HFRolloutEngine(_model(eos_boost=6.0), "float32", "cpu")
    free = engine.generate(PROMPTS, 32, seed=0)
    assert max(len(s.completion_ids) for s in free) < 16  # this model ends early
    forced = engine.generate(PROMPTS, 32, seed=0, min_new_tokens=16)
    for s in forced:
        assert len(s.completion_ids) >= 16
        assert EOS not in s.completion_ids[:16]
    # The recorded log-probs are the unmasked distribution's: what the trainer computes.
    train = trainer_logprobs(_model(eos_boost=6.0), forced, "float32", "cpu")
    for sample, row in zip(forced, train, strict=True):
        assert row == pytest.approx(sample.logprobs, abs=1e-5)
        # Under the unmasked distribution EOS is likely, so the other tokens are unlikely.
        assert max(sample.logprobs[:16]) < -1.0


@pytest.mark.slow
@pytest.mark.kernel_sensitive
def test_probe_on_mixed_length_prompts_passes_its_self_check() -> None:
    prompts = ("Hi", "A considerably longer prompt about printing presses", "Question: 2+2?")
    result = run_probe(
        ProbeConfig(
            prompts=prompts,
            num_prompts=6,
            max_new_tokens=32,
            min_new_tokens=32,
            device="cpu",
        ),
        engines={"hf": hf_engine_factory},
    )
    assert result.valid, result.self_check.message
    r = result.results
    assert r["float32"].metrics.seq_lengths and min(r["float32"].metrics.seq_lengths) >= 5
    # 6 sequences, 114 tokens per dtype: the k3 ratio (theory ~64) above THRESHOLDS["k3"].
    assert r["bfloat16"].metrics.k3_kl > THRESHOLDS["k3"] * r["float16"].metrics.k3_kl
