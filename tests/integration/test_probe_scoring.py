"""The probe's trainer path: log-probs in chunks, equal to the full-logits computation, for
families with logit transforms, with left-padded batches, and without a [T, vocab] tensor."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from precision_plugin._core.hf_engine import RolloutSample
from precision_plugin.probe.scoring import lm_head_of, trainer_logprobs, trainer_precision

SHAPE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def _model(family: str) -> Any:
    import transformers as tf

    configs = {
        "llama": (tf.LlamaConfig, {}),
        # Final logit soft-capping (small cap so tanh bends) and sliding-window attention.
        "gemma2": (tf.Gemma2Config, {"final_logit_softcapping": 3.0, "sliding_window": 4}),
        "cohere": (tf.CohereConfig, {"logit_scale": 0.5}),  # logits scaled after the head
        "granite": (tf.GraniteConfig, {"logits_scaling": 4.0}),  # logits divided
    }
    cls, extra = configs[family]
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cls(**SHAPE, **extra)).eval()


def _samples(vocab: int, shapes: list[tuple[int, int]]) -> list[RolloutSample]:
    g = torch.Generator().manual_seed(1)
    return [
        RolloutSample(
            torch.randint(3, vocab, (p,), generator=g).tolist(),
            torch.randint(3, vocab, (c,), generator=g).tolist(),
            [],
        )
        for p, c in shapes
    ]


def _full_logits_reference(model: Any, samples: list[RolloutSample], dtype: str) -> list[list]:
    """The computation the probe used to do: one forward, [T, vocab] float32 log-softmax."""
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        start, total = len(s.prompt_ids), ids.shape[1]
        with torch.inference_mode(), trainer_precision(dtype, "cpu"):
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(total)[None],
                use_cache=False,
            ).logits
        logp = torch.log_softmax(logits[0, start - 1 : total - 1].float(), dim=-1)
        out.append(logp.gather(-1, ids[0, start:, None]).squeeze(-1).tolist())
    return out


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.mark.parametrize("family", ["llama", "gemma2", "cohere", "granite"])
def test_chunked_logprobs_equal_the_full_logits(family: str) -> None:
    model = _model(family)
    assert lm_head_of(model).chunked, "the family's logit transform should be recognised"
    samples = _samples(300, [(5, 9), (12, 3), (7, 20)])
    for dtype in ("float32", "bfloat16", "float16"):
        reference = _full_logits_reference(model, samples, dtype)
        # 7 positions per chunk: every sequence spans several chunks.
        chunked = trainer_logprobs(model, samples, dtype, "cpu", chunk_logits=7 * 300)
        # float32: a different GEMM shape (rounding only); low precision: the same ops exactly.
        assert _max_diff(reference, chunked) < (1e-5 if dtype == "float32" else 1e-6), dtype


def test_left_padded_batch_equals_one_by_one_in_float32() -> None:
    model = _model("llama")
    samples = _samples(300, [(5, 9), (12, 3), (7, 20), (2, 1)])
    single = trainer_logprobs(model, samples, "float32", "cpu")
    batched = trainer_logprobs(model, samples, "float32", "cpu", batch_size=4)
    assert _max_diff(single, batched) < 1e-5


class _DoubledLogits(torch.nn.Module):
    """A causal LM whose logits are NOT lm_head(hidden): an unknown family transform."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_output_embeddings(self) -> Any:
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs: Any) -> Any:
        out = self.inner(**kwargs)
        out.logits = out.logits * 2.0
        return out


def test_an_unknown_logit_transform_falls_back_to_the_full_logits() -> None:
    model = _DoubledLogits(_model("llama")).eval()
    assert not lm_head_of(model).chunked
    samples = _samples(300, [(4, 6)])
    assert (
        _max_diff(
            _full_logits_reference(model, samples, "float32"),
            trainer_logprobs(model, samples, "float32", "cpu"),
        )
        < 1e-6
    )


def test_no_tensor_of_sequence_by_vocab_is_allocated() -> None:
    """The largest single allocation is one chunk of logits, not [T, vocab]."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, completion = 20_000, 600
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    ).eval()
    samples = _samples(vocab, [(10, completion)])
    chunk = 1 << 20
    trainer_logprobs(model, samples, "float32", "cpu", chunk_logits=chunk)  # the head check
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        trainer_logprobs(model, samples, "float32", "cpu", chunk_logits=chunk)
    largest = max(e.self_cpu_memory_usage for e in prof.events())
    full = completion * vocab * 4  # the old float32 log-softmax alone
    assert largest <= (chunk // vocab) * vocab * 4 < full / 10
