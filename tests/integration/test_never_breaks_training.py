"""The plugin inside a real HF Trainer on CPU: whatever stops ``train()`` (an exception, Ctrl-C),
nothing the plugin put on the model stays there; its own problems never stop training."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("accelerate")

from transformers import Trainer, TrainerCallback, TrainingArguments

import precision_plugin as pp
from precision_plugin import PrecisionCallback
from precision_plugin.overflow.fallback import is_fp32
from precision_plugin.patching import tracked
from tests.integration.test_overflow_trainer import _data
from tests.tiny import OVERFLOW_MODULE, overflowing_llama

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")

OVERFLOW = {"detect": "always", "keep_fp32_modules": ["model.layers.*.self_attn", "*.down_*"]}


class Boom(TrainerCallback):
    """Raises at the start of step ``at``, after the plugin's callback installed its hooks."""

    def __init__(self, error: BaseException, at: int = 1) -> None:
        self.error, self.at = error, at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise self.error


def _trainer(model, tmp_path, *callbacks, fp16: bool = True) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=2,
        logging_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        fp16=fp16,
    )
    return Trainer(model=model, args=args, train_dataset=_data(), callbacks=list(callbacks))


def model_untouched(model: torch.nn.Module) -> bool:
    """No hook and no float32 wrapper on any module (Accelerate's own fp32-output wrapper of
    the top-level forward, from ``prepare``, is Accelerate's and stays)."""
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and not is_fp32(m)
        for m in model.modules()
    )


def _dtypes(model: torch.nn.Module) -> dict[str, torch.dtype]:
    return {name: p.dtype for name, p in model.named_parameters()}


@pytest.mark.parametrize("error", [RuntimeError("the user's bug"), KeyboardInterrupt()])
def test_whatever_stops_train_the_model_is_left_as_it_was(tmp_path, error):
    pp.enable(overflow=OVERFLOW)
    model = overflowing_llama()
    trainer = _trainer(model, tmp_path, Boom(error))
    dtypes = _dtypes(model)  # after the Trainer cast its master weights
    with pytest.raises(type(error)):
        trainer.train()
    # No fp32 wrapper, detector hook or forward-dtype probe; parameters in their dtypes.
    assert model_untouched(model), "the plugin left hooks or wrappers on the model"
    assert not is_fp32(model.get_submodule(OVERFLOW_MODULE))
    assert _dtypes(model) == dtypes
    assert tracked() == []
    pp.disable()  # and the patches go as always
    assert model_untouched(model) and pp.current_policy() is None


def test_without_enable_the_changes_are_tracked_and_disable_undoes_them(tmp_path):
    """A callback alone cannot see train() raise: its changes stay registered, and the next
    train() or precision_plugin.disable() removes them."""
    callback = PrecisionCallback({"dtype": "float32", "overflow": OVERFLOW})
    model = overflowing_llama()
    trainer = _trainer(model, tmp_path, callback, Boom(RuntimeError("stop")), fp16=False)
    with pytest.raises(RuntimeError, match="stop"):
        trainer.train()
    assert not model_untouched(model)
    left = tracked()
    assert any("keep_fp32_modules" in t for t in left), left
    assert any("OverflowDetector" in t for t in left), left
    assert pp.disable() is True  # nothing was enabled, but something was undone
    assert model_untouched(model) and tracked() == []
    assert not is_fp32(model.get_submodule(OVERFLOW_MODULE))


def test_a_failing_detector_warns_once_and_training_goes_on(tmp_path, monkeypatch, caplog):
    from precision_plugin.overflow import detect

    def broken(value):
        raise RuntimeError("a tensor the detector did not expect")

    monkeypatch.setattr(detect, "abs_max", broken)
    pp.enable(strictness="error", overflow={"detect": "always"})
    model = overflowing_llama()
    trainer = _trainer(model, tmp_path)
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        trainer.train()  # strictness="error" stops only on a precision error, not on this
    warned = [r for r in caplog.records if "forward-overflow detection is skipped" in r.message]
    assert len(warned) == 1, [r.message for r in caplog.records]
    assert trainer.state.global_step == 3
    assert model_untouched(model)
