"""The ``Trainer`` wraps that bind the
[`PrecisionCallback`][precision_plugin.callback.PrecisionCallback] to every trainer ``enable()``
sees, and undo its changes however ``train()`` ends.

A built-in plugin of its own (adapter name ``transformers.trainer``; ``skip_adapters=
["transformers"]`` skips it with the rest of the transformers adapter). It sits beside the
callback (layer 4) rather than in the learner adapter (layer 3), which may not import it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from precision_plugin._base.versions import installed_version
from precision_plugin._core.master_weights import prepare_model_once
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.transformers import _uses_deepspeed

# ``precision_plugin.callback`` imports transformers: imported inside the wraps, which run only
# once transformers' Trainer exists, so registering this plugin needs no transformers.


def _trainer_init(
    policy: PrecisionPolicy, original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any
) -> None:
    original(self, *args, **kwargs)
    from precision_plugin.callback import bind_callback

    if getattr(self, "model", None) is not None and not _uses_deepspeed(self.args, self):
        prepare_model_once(self.model, policy)
    bind_callback(self, policy)


def _trainer_train(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return original(self, *args, **kwargs)
    finally:  # also on an exception or KeyboardInterrupt: nothing of the run stays on the model
        from precision_plugin.callback import PrecisionCallback

        handler = getattr(self, "callback_handler", None)
        for callback in getattr(handler, "callbacks", ()):
            if isinstance(callback, PrecisionCallback):
                callback.release()


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Any) -> None:
    """Wrap ``Trainer.__init__`` (bind the callback, cast the model once) and ``Trainer.train``
    (release what the callback changed, also when it raises)."""
    if installed_version("transformers") is None:
        return
    patcher.wrap_on_import(
        "transformers.trainer",
        "Trainer.__init__",
        functools.partial(_trainer_init, policy),
        reason="callbacks never receive the trainer; binding it and fixing the model's "
        "dtypes before the first step needs the constructed trainer",
    )
    patcher.wrap_on_import(
        "transformers.trainer",
        "Trainer.train",
        _trainer_train,
        reason="no callback runs when train() raises; what the run changed on the model (fp32 "
        "wrappers, detector hooks, telemetry) is undone here",
    )
