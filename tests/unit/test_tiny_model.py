"""The embedded default model: deterministic weights, a byte-level tokenizer, a real checkpoint."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from precision_plugin.probe.tiny_model import (
    DEFAULT_CONFIG,
    build_default_model,
    build_tokenizer,
    save_default_model,
)


def test_weights_depend_only_on_the_seed_and_leave_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    first, _ = build_default_model()
    assert torch.equal(before, torch.random.get_rng_state())
    second, _ = build_default_model()
    other, _ = build_default_model(seed=7)
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)


def test_default_architecture_and_dtype() -> None:
    model, tokenizer = build_default_model()
    cfg = model.config
    assert cfg.model_type == "llama"
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (4, 256)
    assert cfg.hidden_size == DEFAULT_CONFIG["hidden_size"]
    assert cfg.vocab_size == len(tokenizer) == 259
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not model.training


def test_tokenizer_round_trips_any_text_and_never_yields_special_ids() -> None:
    tok = build_tokenizer()
    text = "Héllo, wörld! 1+1=2\n\tdef f(x): return x ✓"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert min(ids) >= 3  # 0, 1, 2 are <pad>, <bos>, <eos>
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_saved_copy_is_a_normal_hf_checkpoint(tmp_path) -> None:
    folder = save_default_model(tmp_path / "tiny")
    assert (folder / "config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(folder).float()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    built, _ = build_default_model()
    for a, b in zip(built.parameters(), loaded.parameters(), strict=True):
        assert torch.equal(a, b)
    assert tokenizer("abc").input_ids == build_tokenizer()("abc").input_ids


def test_next_token_distribution_is_peaked_like_a_trained_lm() -> None:
    """Sampled tokens carry real probability mass (a random-init model's are all below ~0.05)."""
    from precision_plugin.probe.inputs import PROMPTS

    model, tokenizer = build_default_model()
    ids = torch.tensor([tokenizer(PROMPTS[i]).input_ids[:16] for i in range(4)])
    generator = torch.Generator().manual_seed(0)
    sampled = []
    with torch.no_grad():
        for _ in range(32):
            probs = model(ids).logits[:, -1].softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator)
            sampled.append(probs.gather(1, token).squeeze(1))
            ids = torch.cat([ids, token], dim=1)
    sampled = torch.cat(sampled)
    assert sampled.median() > 0.2
    assert (sampled > 0.3).float().mean() > 0.3
