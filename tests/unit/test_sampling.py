"""Sampling settings applied exactly as vLLM applies them, and the log-probs the HF engine
records: exact values against an independent row-by-row reading of vLLM's sampler
(tests/sampling_reference.py), on the logits the engine's own model produced."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from precision_plugin._core.hf_engine import HFRolloutEngine
from precision_plugin._core.sampling import LogitsProcessor, SamplingSettings
from precision_plugin.errors import PrecisionConfigError
from tests.sampling_reference import logprob, processed_logits

VOCAB = 48
EOS = 2

EVERYTHING = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 20,
    "min_p": 0.02,
    "repetition_penalty": 1.3,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.25,
}


def _model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


PROMPTS = [[1, 5, 9, 9, 14], [1, 7], [1, 30, 31, 5, 6, 40, 41]]


def _run(dtype: str, sampling: SamplingSettings, tokens: int = 12, min_new: int = 0):
    """Generate with the engine and capture the logits its model produced at every step."""
    engine = HFRolloutEngine(_model(), dtype, "cpu")
    steps: list[torch.Tensor] = []
    handle = engine.model.register_forward_hook(
        lambda _m, _a, out: steps.append(out.logits[:, -1].detach().clone())
    )
    try:
        samples = engine.generate(PROMPTS, tokens, seed=11, sampling=sampling,
                                  min_new_tokens=min_new)  # fmt: skip
    finally:
        handle.remove()
    return samples, steps


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    "settings",
    [{"temperature": 0.7}, {"top_p": 0.8}, {"top_k": 5}, {"min_p": 0.1},
     {"repetition_penalty": 1.5}, EVERYTHING],
    ids=["temperature", "top_p", "top_k", "min_p", "repetition", "everything"],
)  # fmt: skip
def test_processed_logprobs_are_the_distribution_sampled_from(dtype, settings):
    sampling = SamplingSettings(**settings, logprobs_mode="processed_logprobs")
    samples, steps = _run(dtype, sampling)
    for row, sample in enumerate(samples):
        assert sample.prompt_ids == PROMPTS[row]
        for t, token in enumerate(sample.completion_ids):
            expected = processed_logits(
                steps[t][row], PROMPTS[row], sample.completion_ids[:t], **settings
            )
            assert math.isfinite(float(expected[token])), (row, t)  # sampled from what is kept
            assert sample.logprobs[t] == logprob(expected, token), (row, t)


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
@pytest.mark.parametrize(
    "settings", [{"temperature": 0.6}, EVERYTHING], ids=["temperature", "everything"]
)
def test_tokens_are_drawn_from_the_processed_distribution(settings, mode):
    """Each token is the draw the row's own generator (seed + row) makes from softmax of the
    logits processed once as vLLM processes them: replayed here step by step, so a sampling step
    that applies the temperature (or any setting) again, or samples the raw logits, picks other
    tokens even where the recorded log-prob is right."""
    sampling = SamplingSettings(**settings, logprobs_mode=mode)
    samples, steps = _run("float16", sampling, tokens=16)
    for row, sample in enumerate(samples):
        generator = torch.Generator().manual_seed(11 + row)
        for t, token in enumerate(sample.completion_ids):
            expected = processed_logits(
                steps[t][row], PROMPTS[row], sample.completion_ids[:t], **settings
            )
            drawn = torch.multinomial(torch.softmax(expected, -1), 1, generator=generator)
            assert token == int(drawn), (row, t)


def test_temperature_divides_once():
    samples, steps = _run("float16", SamplingSettings(temperature=0.6,
                                                      logprobs_mode="processed_logprobs"))  # fmt: skip
    for row, sample in enumerate(samples):
        for t, token in enumerate(sample.completion_ids):
            scaled = steps[t][row].float() / torch.tensor(0.6)
            assert sample.logprobs[t] == float(torch.log_softmax(scaled, -1)[token])
            twice = float(torch.log_softmax(scaled / torch.tensor(0.6), -1)[token])
            assert sample.logprobs[t] != twice


def test_raw_logprobs_ignore_every_setting_and_min_tokens():
    """vLLM's raw_logprobs: log_softmax of the model's logits, before penalties, temperature,
    filters and the min-tokens mask (the probe's mode)."""
    sampling = SamplingSettings(**EVERYTHING)
    assert sampling.logprobs_mode == "raw_logprobs"
    samples, steps = _run("float16", sampling, tokens=10, min_new=10)
    for row, sample in enumerate(samples):
        assert len(sample.completion_ids) == 10 and EOS not in sample.completion_ids
        for t, token in enumerate(sample.completion_ids):
            assert sample.logprobs[t] == logprob(steps[t][row], token)
            kept = processed_logits(steps[t][row], PROMPTS[row], sample.completion_ids[:t],
                                    **EVERYTHING, stop=[EOS])  # fmt: skip
            assert math.isfinite(float(kept[token]))


def test_top_k_one_is_greedy_with_log_prob_zero():
    samples, steps = _run("float32", SamplingSettings(top_k=1, logprobs_mode="processed_logprobs"))
    for row, sample in enumerate(samples):
        for t, token in enumerate(sample.completion_ids):
            assert token == int(steps[t][row].argmax()) and sample.logprobs[t] == 0.0


def test_settings_change_what_is_sampled():
    """The issue's top_p=0.9 run was bit-identical to top_p=1: no longer."""
    plain, _ = _run("float32", SamplingSettings(), tokens=24)
    nucleus, _ = _run("float32", SamplingSettings(top_p=0.5), tokens=24)
    assert [s.completion_ids for s in plain] != [s.completion_ids for s in nucleus]


def test_processor_counts_penalised_tokens_per_row():
    processor = LogitsProcessor(SamplingSettings(frequency_penalty=1.0), [[3], [4, 4]], 8, "cpu")
    processor.add(torch.tensor([[5], [5]]))
    processor.add(torch.tensor([[5], [6]]))
    out = processor.process(torch.zeros(2, 8))
    assert out[0].tolist() == [0, 0, 0, 0, 0, -2, 0, 0]
    assert out[1].tolist() == [0, 0, 0, 0, 0, -1, -1, 0]


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("temperature", 0.0, "[1e-05, 2]"),
        ("temperature", 2.5, "[1e-05, 2]"),
        ("temperature", 1e-9, "below 1e-05 vLLM samples greedily"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_k", -2, "0 or -1"),
        ("top_k", 2.5, "expected an int"),
        ("min_p", 1.5, "[0, 1]"),
        ("repetition_penalty", 0.0, "> 0"),
        ("frequency_penalty", 3.0, "[-2, 2]"),
        ("presence_penalty", math.nan, "not a finite number"),
        ("logprobs_mode", "raw_logits", "processed_logprobs"),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_setting(field, value, allowed):
    with pytest.raises(PrecisionConfigError) as info:
        SamplingSettings(**{field: value})
    message = str(info.value)
    assert message.startswith(f"SamplingSettings(): argument {field!r} got ")
    assert allowed in message and "\n" not in message


def test_engine_refuses_what_is_not_a_sampling_settings():
    engine = HFRolloutEngine(_model(), "float32", "cpu")
    with pytest.raises(
        PrecisionConfigError, match=r"argument 'sampling' got dict .*expected a SamplingSettings"
    ):
        engine.generate(PROMPTS, 2, 0, sampling={"temperature": 0.7})


# -- TRL's settings, as TRL's vLLM path passes them ---------------------------------------------
def test_trainer_settings_and_generation_kwargs_map_as_trls_vllm_path():
    from trl import GRPOConfig

    from precision_plugin.trl.rollout import sampling_settings

    args = GRPOConfig(
        output_dir="/tmp/unused", use_cpu=True, bf16=False, temperature=0.7, top_p=0.9, top_k=20, min_p=None,
        repetition_penalty=1.1, max_completion_length=17,
        generation_kwargs={"frequency_penalty": 0.2, "top_k": 5},
    )  # fmt: skip
    trainer = SimpleNamespace(args=args, temperature=0.7, top_p=0.9, top_k=20, min_p=None,
                              repetition_penalty=1.1)  # fmt: skip
    settings, budget = sampling_settings(trainer)
    assert budget == 17
    assert settings == SamplingSettings(
        temperature=0.7, top_p=0.9, top_k=5, min_p=0.0, repetition_penalty=1.1,
        frequency_penalty=0.2, logprobs_mode="processed_logprobs",
    )  # fmt: skip


def test_generation_kwargs_hfrollout_cannot_apply_are_refused():
    from trl import GRPOConfig

    from precision_plugin.trl.rollout import sampling_settings

    args = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False,
                      generation_kwargs={"stop": ["x"], "seed": 3})  # fmt: skip
    with pytest.raises(PrecisionConfigError, match=r"generation_kwargs \['seed', 'stop'\]"):
        sampling_settings(SimpleNamespace(args=args))
