"""TRL GRPOTrainer (use_vllm=False, tiny in-code model and data) on CPU with precision_plugin."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

import transformers
import trl
from trl.trainer.base_config import _BaseConfig

import precision_plugin as pp
from precision_plugin import PrecisionCallback, PrecisionMismatchError

RECIPE = Path(__file__).resolve().parents[2] / "integrations/trl/grpo_fp16.py"


def _recipe():
    spec = importlib.util.spec_from_file_location("grpo_fp16_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


@pytest.mark.slow
def test_grpo_recipe_trains_fp16_logs_loss_scale_and_disable_restores(tmp_path):
    originals = {
        (cls, name): vars(cls)[name]
        for cls, name in [
            (_BaseConfig, "__post_init__"),
            (transformers.TrainingArguments, "__post_init__"),
            (transformers.Trainer, "__init__"),
            (__import__("accelerate").Accelerator, "__init__"),
            (__import__("accelerate").Accelerator, "prepare_model"),
        ]
    }
    report = _recipe().main(["--max-steps", "2", "--output-dir", str(tmp_path)])
    assert report["fp16"] is True and report["bf16"] is False  # TRL alone would pick bf16
    assert report["forward_dtype"] == "float16"
    assert report["steps"] == 2
    # 2 steps cannot reach the policy's growth interval (400): the default init scale, halved
    # once per skipped step
    assert report["loss_scale"] == 2.0**16 * 0.5 ** report["skipped_steps"]
    assert pp.current_policy() is None  # the recipe disabled the plugin
    for (cls, name), original in originals.items():
        assert vars(cls)[name] is original, f"{cls.__name__}.{name} not restored"


def test_unset_flags_follow_the_policy_and_explicit_bf16_is_refused(tmp_path):
    assert trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True).bf16  # TRL's own default
    pp.enable()
    config = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert (config.fp16, config.bf16) == (True, False)
    pp.enable(strictness="error")
    with pytest.raises(PrecisionMismatchError, match="bf16=True"):
        trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=True)


@pytest.mark.slow
def test_bf16_adapters_are_made_fp32_before_the_first_step(tmp_path, caplog):
    """TRL casts QLoRA adapters to bf16 before Trainer.__init__; the plugin casts them back."""
    recipe = _recipe()
    pp.enable()
    model, tokenizer = recipe.build_model_and_tokenizer()
    for name, param in model.named_parameters():
        if "mlp" in name:
            param.data = param.data.to(torch.bfloat16)  # what grpo_trainer.py does for QLoRA
        else:
            param.requires_grad_(False)
    original = recipe.build_model_and_tokenizer
    recipe.build_model_and_tokenizer = lambda: (model, tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="precision_plugin"):
            trainer = recipe.build_trainer(str(tmp_path), max_steps=1)
    finally:
        recipe.build_model_and_tokenizer = original
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert "bfloat16 -> float32" in caplog.text
    trainer.train()
    callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback)]
    assert len(callbacks) == 1 and callbacks[0].forward_dtype == torch.float16
    assert "precision/loss_scale" in trainer.state.log_history[0]


@pytest.mark.parametrize(
    ("dtype", "flags"),
    [("float16", (True, False)), ("bfloat16", (False, True)), ("float32", (False, False))],
)
def test_trl_flags_are_settled_once_for_every_dtype(tmp_path, monkeypatch, dtype, flags):
    """TRL's config runs two ``__post_init__`` levels; the flags are decided at the first."""
    from precision_plugin import transformers as adapter

    calls = []
    coerce = adapter._coerce_flags
    monkeypatch.setattr(adapter, "_coerce_flags", lambda *a: calls.append(1) or coerce(*a))
    pp.enable(dtype=dtype)
    config = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert (config.fp16, config.bf16) == flags and len(calls) == 1


@pytest.mark.slow
def test_the_policy_scaler_settings_reach_grpos_scaler(tmp_path):
    pp.enable(loss_scaler={"init_scale": 1024.0, "growth_interval": 123, "backoff_factor": 0.25})
    trainer = _recipe().build_trainer(str(tmp_path), max_steps=2)
    scaler = trainer.accelerator.scaler
    assert scaler.get_growth_interval() == 123 and scaler.get_scale() == 1024.0
    assert scaler.get_backoff_factor() == 0.25
    trainer.train()
    stats = scaler.precision_stats()
    assert stats.steps == 2
    logged = [h for h in trainer.state.log_history if "precision/loss_scale" in h]
    assert logged[-1]["precision/skipped_steps"] == stats.skipped_steps
    assert logged[-1]["precision/loss_scale"] == 1024.0 * 0.25**stats.skipped_steps
