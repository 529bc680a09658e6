"""HF Trainer on CPU with the real transformers/Accelerate: flags, master weights, metrics."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("accelerate")

import transformers
from datasets import Dataset
from transformers import LlamaForCausalLM, Trainer, TrainingArguments

import precision_plugin as pp
from precision_plugin import PrecisionCallback, PrecisionMismatchError
from tests.tiny import tiny_llama

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


def _model(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    return tiny_llama().to(dtype)


def _data() -> Dataset:
    ids = [[(i * 7 + j) % 64 for j in range(8)] for i in range(8)]
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=2,
        logging_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    return TrainingArguments(**{**base, **kw})


def _metrics(trainer: Trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


def test_without_plugin_cpu_fp16_trains_in_fp32_without_scaler(tmp_path):
    trainer = Trainer(model=_model(), args=_args(tmp_path, fp16=True), train_dataset=_data())
    assert trainer.accelerator.scaler is None and not trainer.accelerator.native_amp


def test_fp16_model_with_fp16_flag_trains_after_enable(tmp_path):
    pp.enable(loss_scaler={"growth_interval": 50})
    model = _model(torch.float16)  # as from_pretrained(..., dtype=torch.float16)
    trainer = Trainer(model=model, args=_args(tmp_path, fp16=True), train_dataset=_data())
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert trainer.accelerator.scaler.get_growth_interval() == 50
    callback = trainer.callback_handler.callbacks[0]
    assert isinstance(callback, PrecisionCallback) and callback.trainer is trainer
    trainer.train()
    assert callback.forward_dtype == torch.float16  # the training forward really ran fp16
    logged = _metrics(trainer)
    assert len(logged) == 3
    stats = trainer.accelerator.scaler.precision_stats()
    assert stats.steps == 3
    # growth every 50 clean steps cannot happen in 3: the scale is the policy's init_scale,
    # halved once per skipped step, exactly
    for h in logged:
        assert h["precision/loss_scale"] == 2.0**16 * 0.5 ** h["precision/skipped_steps"]
    assert logged[-1]["precision/skipped_steps"] == stats.skipped_steps
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_policy_scale_and_skips_reach_the_trainer_exactly(tmp_path):
    """init_scale 2**40 overflows fp16 for sure (loss gradients ~0.06 x 2**40 > 65504): every
    step of this short run is skipped and halves the scale, as the policy says."""
    pp.enable(loss_scaler={"init_scale": 2.0**40, "growth_interval": 7})
    trainer = Trainer(model=_model(), args=_args(tmp_path, fp16=True), train_dataset=_data())
    scaler = trainer.accelerator.scaler
    assert (scaler.get_scale(), scaler.get_growth_interval()) == (2.0**40, 7)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor()) == (2.0, 0.5)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logged = _metrics(trainer)
    assert [h["precision/loss_scale"] for h in logged] == [2.0**39, 2.0**38, 2.0**37]
    assert [h["precision/skipped_steps"] for h in logged] == [1.0, 2.0, 3.0]
    assert [h["precision/consecutive_skips"] for h in logged] == [1.0, 2.0, 3.0]
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_fp16_model_refused_in_strict_mode(tmp_path):
    pp.enable(strictness="error")
    with pytest.raises(PrecisionMismatchError, match="Attempting to unscale FP16 gradients"):
        Trainer(model=_model(torch.float16), args=_args(tmp_path, fp16=True), train_dataset=_data())


def test_bf16_flag_is_coerced_or_refused(tmp_path, caplog):
    pp.enable()
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        args = _args(tmp_path, bf16=True)
    assert (args.fp16, args.bf16, args.mixed_precision) == (True, False, "fp16")
    assert "bf16=True" in caplog.text
    assert _args(tmp_path).fp16  # flags left unset follow the policy
    pp.enable(strictness="error")
    with pytest.raises(PrecisionMismatchError, match="bf16=True"):
        _args(tmp_path, bf16=True)


def test_callback_without_enable_reports_fp32_forward(tmp_path, caplog):
    callback = PrecisionCallback()
    trainer = Trainer(
        model=_model(),
        args=_args(tmp_path, fp16=True, max_steps=1),
        train_dataset=_data(),
        callbacks=[callback],
    )
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        trainer.train()
    assert callback.forward_dtype == torch.float32
    assert "forward ran in float32" in caplog.text and "enable()" in caplog.text


def test_callback_without_enable_strict_stops_before_training(tmp_path):
    callback = PrecisionCallback(pp.PrecisionPolicy(strictness="error"))
    trainer = Trainer(
        model=_model(),
        args=_args(tmp_path, fp16=True, max_steps=1),
        train_dataset=_data(),
        callbacks=[callback],
    )
    callback.bind(trainer)
    with pytest.raises(PrecisionMismatchError, match="no loss scaler"):
        trainer.train()


def test_disable_restores_transformers_exactly():
    post_init = vars(TrainingArguments)["__post_init__"]
    init = vars(Trainer)["__init__"]
    pp.enable()
    assert vars(Trainer)["__init__"] is not init
    pp.disable()
    assert vars(TrainingArguments)["__post_init__"] is post_init
    assert vars(Trainer)["__init__"] is init
    assert transformers.Trainer is Trainer


def test_each_decision_is_made_once_per_trainer(tmp_path, monkeypatch):
    """The Trainer, Accelerator.prepare_model and the callback see one model: cast it once."""
    from precision_plugin import transformers as adapter
    from precision_plugin._core import master_weights

    calls = {"prepare_model": 0, "flags": 0}
    # prepare_model's body for a resolved policy (what prepare_model_once runs).
    prepare, coerce = master_weights._prepare, adapter._coerce_flags

    def counted_prepare(*args, **kwargs):
        calls["prepare_model"] += 1
        return prepare(*args, **kwargs)

    def counted_coerce(*args, **kwargs):
        calls["flags"] += 1
        return coerce(*args, **kwargs)

    monkeypatch.setattr(master_weights, "_prepare", counted_prepare)
    monkeypatch.setattr(adapter, "_coerce_flags", counted_coerce)
    pp.enable()
    model = _model(torch.float16)
    trainer = Trainer(model=model, args=_args(tmp_path, max_steps=1), train_dataset=_data())
    trainer.train()
    assert calls == {"prepare_model": 1, "flags": 1}
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    # Another policy is another decision: the same model is settled again.
    pp.enable(dtype="bfloat16")
    master_weights.prepare_model_once(model, pp.current_policy())
    assert calls["prepare_model"] == 2
