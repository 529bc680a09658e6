"""Undo a callback's changes when ``train()`` raises, without ``enable()``.

A ``TrainerCallback`` has no exception event (transformers 5.2x ``trainer_callback.py``: the
events end with ``on_train_end``, which an exception skips), so a ``PrecisionCallback`` used
alone would leave its fp32 wrappers and hooks on the model after an exception until the next
``train()``. [`guard_train`][precision_plugin._core.train_guard.guard_train] wraps that trainer's
own
``train`` (the instance attribute, not the class), through the reversible-patch helper, so the
callback's ``release`` runs however ``train()`` ends. ``precision_plugin.disable()`` removes the
wrap (it is tracked).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from precision_plugin._base.patching import ORIGINAL_ATTR, Patcher


def guard_train(trainer: Any, release: Callable[[], Any]) -> Patcher | None:
    """Make ``trainer.train`` call ``release`` (a bound method, held weakly) when it ends, on an
    exception or ``KeyboardInterrupt`` too; return the patcher that undoes it. ``None`` when
    ``enable()``'s ``Trainer.train`` wrapper already does this, or the trainer has no ``train``."""
    if not callable(getattr(trainer, "train", None)):
        return None
    if hasattr(getattr(type(trainer), "train", None), ORIGINAL_ATTR):
        return None  # enable()'s class-level wrapper releases every PrecisionCallback
    undo = weakref.WeakMethod(release)  # type: ignore[arg-type]

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def train(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:  # on_train_end already released on success; release is idempotent
                callback_release = undo()
                if callback_release is not None:
                    callback_release()

        return train

    patcher = Patcher("PrecisionCallback", tracked=True)
    patcher.wrap(
        trainer,
        "train",
        make,
        reason="a TrainerCallback has no exception event; this undoes the callback's changes "
        "on the model when train() raises",
    )
    return patcher
