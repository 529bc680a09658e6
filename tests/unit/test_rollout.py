"""The HF rollout engine: KV-cache sampling at temperature 1 with the engine's own log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from precision_plugin._core.hf_engine import HFRolloutEngine, RolloutEngine, load_causal_lm
from precision_plugin.probe import build_prompts, trainer_logprobs
from precision_plugin.probe.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1-layer Llama saved with a generation_config that would make sampling greedy."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=256,
        initializer_range=0.1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # A checkpoint's sampling defaults must not leak into the probe's rollout.
    model.generation_config = GenerationConfig(
        do_sample=True, top_k=1, temperature=0.1, no_repeat_ngram_size=1, eos_token_id=2
    )
    folder = tmp_path_factory.mktemp("rollout") / "llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _prompts(checkpoint: str, n: int = 4) -> list[list[int]]:
    _, tokenizer = load_causal_lm(checkpoint, "cpu")
    return build_prompts(tokenizer, n)


def test_engine_follows_the_protocol(checkpoint: str) -> None:
    engine = HFRolloutEngine.from_pretrained(checkpoint, "float16", "cpu")
    assert isinstance(engine, RolloutEngine)
    assert engine.name == "hf"
    assert all(p.dtype == torch.float16 for p in engine.model.parameters())
    engine.close()


def test_samples_have_one_finite_logprob_per_token_and_stop_at_eos(checkpoint: str) -> None:
    prompts = _prompts(checkpoint)
    engine = HFRolloutEngine.from_pretrained(checkpoint, "float32", "cpu")
    samples = engine.generate(prompts, 40, seed=3)
    assert [s.prompt_ids for s in samples] == prompts
    for s in samples:
        assert 1 <= len(s.completion_ids) <= 40
        assert len(s.logprobs) == len(s.completion_ids)
        assert all(math.isfinite(v) and v <= 0 for v in s.logprobs)
        assert 2 not in s.completion_ids[:-1]  # nothing after the first EOS


def test_seed_makes_sampling_reproducible(checkpoint: str) -> None:
    prompts = _prompts(checkpoint)
    engine = HFRolloutEngine.from_pretrained(checkpoint, "bfloat16", "cpu")
    a = engine.generate(prompts, 24, seed=5)
    b = engine.generate(prompts, 24, seed=5)
    c = engine.generate(prompts, 24, seed=6)
    assert [s.completion_ids for s in a] == [s.completion_ids for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    assert [s.completion_ids for s in a] != [s.completion_ids for s in c]


def test_samples_full_distribution_despite_checkpoint_generation_config(checkpoint: str) -> None:
    """The checkpoint asks for top_k=1, temperature 0.1 and no repeated token at all."""
    model, _ = load_causal_lm(checkpoint, "cpu")
    prompts = _prompts(checkpoint)
    samples = HFRolloutEngine(model, "float32", "cpu").generate(prompts, 32, seed=0)
    full, _ = load_causal_lm(checkpoint, "cpu")
    not_argmax = repeats = 0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.inference_mode():
            logits = full(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
        not_argmax += int((logits.argmax(-1) != ids[0, len(s.prompt_ids) :]).sum())
        seen = set(s.prompt_ids)
        for token in s.completion_ids:
            repeats += token in seen
            seen.add(token)
    assert not_argmax > 10
    assert repeats > 0  # no_repeat_ngram_size=1 would forbid every repeat


def test_float32_engine_logprobs_match_a_full_forward(checkpoint: str) -> None:
    model, _ = load_causal_lm(checkpoint, "cpu")
    engine = HFRolloutEngine.from_pretrained(checkpoint, "float32", "cpu")
    samples = engine.generate(_prompts(checkpoint), 48, seed=1)
    train = trainer_logprobs(model, samples, "float32", "cpu")
    for s, t in zip(samples, train, strict=True):
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(t), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_engine_leaves_the_callers_model_as_it_was(checkpoint: str, dtype: str) -> None:
    """The engine converts its own deep copy: the model handed to it keeps its float32
    weights, bit for bit, and its plain ``nn.Linear`` layers."""
    model, _ = load_causal_lm(checkpoint, "cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = {name: type(m) for name, m in model.named_modules()}
    engine = HFRolloutEngine(model, dtype, "cpu")
    engine.generate(_prompts(checkpoint, 2), 8, seed=0)
    assert {name: type(m) for name, m in model.named_modules()} == classes
    assert type(model.lm_head) is torch.nn.Linear
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == getattr(torch, dtype) for p in engine.model.parameters())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_model_built_under_inference_mode_samples_as_any_other(
    checkpoint: str, dtype: str
) -> None:
    """Inference tensors have no version counter (which the packed layers read); the engine's
    copy holds ordinary tensors, so the same weights give the same samples, bit for bit, with
    the default copy and with ``copy=False``."""
    prompts = _prompts(checkpoint, 3)
    model, _ = load_causal_lm(checkpoint, "cpu")
    expected = HFRolloutEngine(model, dtype, "cpu").generate(prompts, 12, seed=4)
    with torch.inference_mode():
        frozen = LlamaForCausalLM(model.config).eval()
        frozen.load_state_dict(model.state_dict())
    assert all(p.is_inference() for p in frozen.parameters())
    for copy in (True, False):
        got = HFRolloutEngine(frozen, dtype, "cpu", copy=copy).generate(prompts, 12, seed=4)
        assert [s.completion_ids for s in got] == [s.completion_ids for s in expected]
        assert [s.logprobs for s in got] == [s.logprobs for s in expected]
