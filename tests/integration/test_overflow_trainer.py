"""Overflow safety inside the real HF Trainer on CPU (fp16 autocast through enable())."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("accelerate")

from datasets import Dataset
from transformers import Trainer, TrainingArguments

import precision_plugin as pp
from precision_plugin import PrecisionCallback
from precision_plugin._core.overflow.fallback import is_fp32
from precision_plugin.errors import ForwardOverflowError
from tests.tiny import OVERFLOW_MODULE, overflowing_llama, tiny_llama

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


def _data() -> Dataset:
    ids = [[(i * 7 + j) % 64 for j in range(8)] for i in range(8)]
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def _trainer(model, tmp_path, steps: int = 3) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=2,
        logging_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        fp16=True,
    )
    return Trainer(model=model, args=args, train_dataset=_data())


def _callback(trainer: Trainer) -> PrecisionCallback:
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback))


def test_detection_stops_training_naming_the_module(tmp_path):
    pp.enable(strictness="error", overflow={"detect": "sampled", "detect_every": 2})
    trainer = _trainer(overflowing_llama(), tmp_path)
    with pytest.raises(ForwardOverflowError) as info:
        trainer.train()
    assert info.value.module == OVERFLOW_MODULE and info.value.step == 0
    assert info.value.module_class == "Linear"


def test_keep_fp32_modules_trains_with_finite_loss_and_is_undone_after(tmp_path):
    pp.enable(
        strictness="error",
        overflow={
            "detect": "always",
            "keep_fp32_modules": ["model.layers.*.self_attn", "*.down_*"],
        },
    )
    model = overflowing_llama()
    trainer = _trainer(model, tmp_path)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    callback = _callback(trainer)
    assert callback.forward_dtype == torch.float16  # checked outside the float32 modules
    detector = callback.overflow_detector
    assert detector.last_checked == (2, None) and detector.events == []  # every step finite
    assert not detector.active  # hooks removed at train end
    assert not is_fp32(model.get_submodule(OVERFLOW_MODULE))


def test_repeated_skips_from_a_forward_overflow_name_the_module(tmp_path, caplog):
    pp.enable(overflow={"diagnose_after_skips": 2})  # detect stays "off"
    trainer = _trainer(overflowing_llama(), tmp_path, steps=4)
    with caplog.at_level(logging.INFO, logger="precision_plugin"):
        trainer.train()
    messages = [r.getMessage() for r in caplog.records]
    assert any("2 skipped steps in a row" in m for m in messages)
    overflow = [m for m in messages if "forward overflow at step 2" in m]
    assert len(overflow) == 1 and OVERFLOW_MODULE in overflow[0]
    assert not any("gradient overflows" in m for m in messages)


def test_repeated_skips_from_gradients_are_told_apart(tmp_path, caplog):
    # A healthy model with an absurd initial loss scale: the forward is finite, the scaled
    # gradients overflow fp16 and the scaler skips until the scale has come down.
    pp.enable(loss_scaler={"init_scale": 2.0**60}, overflow={"diagnose_after_skips": 2})
    trainer = _trainer(tiny_llama(), tmp_path, steps=4)
    with caplog.at_level(logging.INFO, logger="precision_plugin"):
        trainer.train()
    messages = [r.getMessage() for r in caplog.records]
    assert trainer.accelerator.scaler.precision_stats().skipped_steps >= 3
    gradient = [m for m in messages if "gradient overflows" in m]
    assert len(gradient) == 1 and "step 2's forward" in gradient[0]
    assert not any("forward overflow at" in m for m in messages)


def test_train_begin_audit_warns_for_a_known_overflow_family(tmp_path, caplog):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    pp.enable()
    trainer = _trainer(Qwen3MoeForCausalLM(config), tmp_path, steps=1)
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        trainer.train()
    audit = [r.getMessage() for r in caplog.records if "a list by model_type" in r.getMessage()]
    assert len(audit) == 1
    assert "'qwen3_moe'" in audit[0] and "overflow.detect='sampled'" in audit[0]
    assert "precision-plugin probe" in audit[0] and "bfloat16" in audit[0]


def test_grpo_with_detection_checks_generation_and_training_forwards(tmp_path):
    pytest.importorskip("trl")
    import importlib.util
    from pathlib import Path

    recipe_path = Path(__file__).resolve().parents[2] / "integrations/trl/grpo_fp16.py"
    spec = importlib.util.spec_from_file_location("grpo_fp16_recipe_overflow", recipe_path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    pp.enable(strictness="error", overflow={"detect": "always"})
    # TRL's own generate: generation runs the training model (HFRollout samples from a copy).
    trainer = recipe.build_trainer(str(tmp_path), max_steps=1, rollout="trl")
    hooked = []
    model = trainer.model
    original = model.forward

    def counting_forward(*args, **kwargs):  # how many top-level forwards ran with hooks on
        hooked.append(bool(model.model.layers[0]._forward_hooks))
        return original(*args, **kwargs)

    model.forward = counting_forward
    trainer.train()
    del model.forward
    detector = _callback(trainer).overflow_detector
    assert detector.last_checked == (0, None) and detector.events == []
    assert len(hooked) > 1 and all(hooked)  # generation steps and the training forward
