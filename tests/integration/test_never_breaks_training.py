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
from precision_plugin._base.patching import tracked
from precision_plugin._core.overflow.fallback import is_fp32
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


@pytest.mark.parametrize("error", [RuntimeError("stop"), KeyboardInterrupt()])
def test_without_enable_an_exception_in_train_undoes_the_callbacks_changes(tmp_path, error):
    """A callback alone has no exception event: it guards the trainer's own train() (built
    with it), so whatever stops train() leaves nothing on the model; disable() drops the guard."""
    callback = PrecisionCallback({"dtype": "float32", "overflow": OVERFLOW})
    model = overflowing_llama()
    trainer = _trainer(model, tmp_path, callback, Boom(error), fp16=False)
    seen = []
    trainer.add_callback(_Seen(model, seen))
    with pytest.raises(type(error)):
        trainer.train()
    assert seen == [False], "the plugin's changes were not on the model during the run"
    assert model_untouched(model), "the plugin left hooks or wrappers on the model"
    assert not is_fp32(model.get_submodule(OVERFLOW_MODULE))
    assert tracked() == ["PrecisionCallback: <Trainer instance>.train"], tracked()
    assert pp.disable() is True  # nothing was enabled, but the guard was undone
    assert "train" not in vars(trainer) and tracked() == []


def test_a_callback_added_after_init_guards_the_next_train(tmp_path):
    """``add_callback`` after the trainer is built: the first train() binds and guards it (its
    own exception is seen by the next train() or disable()), the next ones are guarded."""
    callback = PrecisionCallback({"dtype": "float32", "overflow": OVERFLOW})
    model = overflowing_llama()
    trainer = _trainer(model, tmp_path, Boom(RuntimeError("stop")), fp16=False)
    trainer.add_callback(callback)
    with pytest.raises(RuntimeError, match="stop"):
        trainer.train()
    assert not model_untouched(model)  # the run that bound the callback was not guarded yet
    with pytest.raises(RuntimeError, match="stop"):
        trainer.train()
    assert model_untouched(model) and tracked() == ["PrecisionCallback: <Trainer instance>.train"]
    pp.disable()
    assert tracked() == []


class _Seen(TrainerCallback):
    """Records, at step 0's begin, whether the model was untouched."""

    def __init__(self, model, seen) -> None:
        self.model, self.seen = model, seen

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and not self.seen:
            self.seen.append(model_untouched(self.model))


def test_a_failing_detector_warns_once_and_training_goes_on(tmp_path, monkeypatch, caplog):
    from precision_plugin._core.overflow import detect

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


def test_one_callback_in_two_trainers_follows_the_one_training(tmp_path):
    """Before: the callback stayed bound to the first trainer built with it, so the second
    trainer's run was checked against the first, and the first's forward was never measured
    again (``forward_dtype`` kept the other run's dtype)."""
    callback = PrecisionCallback()
    first = _trainer(overflowing_llama(), tmp_path / "a", callback, fp16=False)
    second = _trainer(overflowing_llama(), tmp_path / "b", callback, fp16=False)
    assert callback.trainer is second  # the trainer built last
    first.train()
    assert callback.trainer is first and callback.forward_dtype == torch.float32
    callback.forward_dtype = "left by the other run"
    second.train()
    assert callback.trainer is second and callback.forward_dtype == torch.float32
