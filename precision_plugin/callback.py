"""``PrecisionCallback``: the TrainerCallback for the HF Trainer and every TRL trainer.

Without ``enable()``, ``callbacks=[PrecisionCallback()]`` still checks and fixes what a callback can
reach (flags against the policy, parameter dtypes, the dtype the training forward really ran in) and
logs the loss scale; what only exists inside the trainer (the ``Accelerator``'s mixed precision,
fp16 on CPU) it reports instead of fixing. With ``enable()`` every trainer gets one bound to it
automatically (see ``precision_plugin.transformers``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback

from precision_plugin.errors import settle_conflict
from precision_plugin.manager import get_plugin_manager, resolve_policy
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

PREFIX = "precision/"


class _ForwardProbe:
    """Records the output dtype of the first ``Linear`` in the first grad-enabled forward."""

    def __init__(self, model: Any) -> None:
        import torch

        self.dtype: Any = None
        self._handle = None
        linear = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
        if linear is not None:
            self._handle = linear.register_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        import torch

        if torch.is_grad_enabled() and module.training and hasattr(output, "dtype"):
            self.dtype = output.dtype
            self.remove()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _no_trainer() -> None:
    return None


class PrecisionCallback(TrainerCallback):
    """TrainerCallback for the HF Trainer and TRL trainers: checks precision, logs metrics.

    On train begin it runs every adapter's ``precision_train_begin`` hook (flags and model dtypes
    against the policy, a vLLM server's dtype, ...); on the first training step it checks the dtype
    the forward really ran in; on every log it adds the adapters' ``precision_collect_metrics``
    (loss scale, skipped steps, ...) as ``precision/<name>``. ``policy`` (a policy, a dict or a
    dtype name) defaults to [`resolve_policy()`][precision_plugin.manager.resolve_policy]'s answer.
    The trainer is known when ``enable()`` is on (the plugin binds it) or after
    [`bind`][precision_plugin.callback.PrecisionCallback.bind].
    """

    def __init__(self, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None) -> None:
        self._policy = resolve_policy(policy, what="PrecisionCallback()") if policy else None
        self._trainer: Callable[[], Any] = _no_trainer
        self._probe: _ForwardProbe | None = None
        #: The dtype the first training forward ran in (``None`` until it ran).
        self.forward_dtype: Any = None
        self._logs_seen = 0

    def __getstate__(self) -> dict[str, Any]:
        # The trainer reference and the forward hook belong to this process only.
        return {**self.__dict__, "_trainer": _no_trainer, "_probe": None}

    @property
    def policy(self) -> PrecisionPolicy:
        """The policy this callback enforces."""
        return resolve_policy(self._policy)

    @property
    def trainer(self) -> Any:
        """The bound trainer, or ``None``."""
        return self._trainer()

    def bind(self, trainer: Any) -> PrecisionCallback:
        """Give the callback its trainer (held weakly); return the callback."""
        self._trainer = weakref.ref(trainer)
        return self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        get_plugin_manager().hook.precision_train_begin(
            policy=self.policy, args=args, state=state, model=model, trainer=self.trainer
        )
        if model is not None and self.forward_dtype is None:
            self._probe = _ForwardProbe(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe, self._probe = self._probe, None
        if probe is None:
            return
        probe.remove()
        self.forward_dtype = probe.dtype
        wanted = self.policy.torch_dtype
        if probe.dtype is not None and probe.dtype != wanted:
            _report_forward(self.policy, probe.dtype, args)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        if logs is None:
            return
        # Mismatch metrics follow policy.metrics (enabled, every log_every-th log); the loss
        # scaler's telemetry is logged every time.
        settings = self.policy.metrics
        due = settings.enabled and self._logs_seen % settings.log_every == 0
        self._logs_seen += 1
        metrics = self.collect(optimizer=kwargs.get("optimizer"), logs=logs if due else None)
        if not metrics:
            return
        logs.update(metrics)
        if state.log_history:  # Trainer.log appended a copy of `logs` just before on_log
            state.log_history[-1].update(metrics)

    def collect(self, optimizer: Any = None, logs: Any = None) -> dict[str, float]:
        """The ``precision/<name>`` metrics to log now.

        Adapter metrics and the loss scaler's telemetry, plus the mismatch metrics the trainer
        itself put in ``logs`` (TRL's ``sampling/sampling_logp_difference/*``, ...) under our
        names.
        """
        merged: dict[str, float] = {}
        results = get_plugin_manager().hook.precision_collect_metrics(
            policy=self.policy, trainer=self.trainer
        )
        for result in reversed(results):  # first-registered adapter wins a name clash
            merged.update(result or {})
        if "loss_scale" not in merged:
            from precision_plugin.scaler import scaler_stats

            stats = scaler_stats(getattr(optimizer, "scaler", None))
            if stats is not None:
                merged.update(stats.as_metrics())
        if logs:
            from precision_plugin.trl import alias_metrics

            merged.update(alias_metrics(logs))
        return {PREFIX + k: float(v) for k, v in merged.items()}


def _report_forward(policy: PrecisionPolicy, ran: Any, args: Any) -> None:
    short = str(ran).removeprefix("torch.")
    message = (
        f"the training forward ran in {short} but the policy is {policy.dtype} (mixed_precision "
        f"{getattr(args, 'mixed_precision', '?')!r})"
    )
    fix = (
        "call precision_plugin.enable() before building the trainer (on CPU, Accelerate and the "
        "HF Trainer silently run fp32 when asked for fp16; enable() makes them run fp16)"
    )
    settle_conflict(policy.strictness, message, fix=fix, outcome=f"fix: {fix}")


def bind_callback(trainer: Any, policy: PrecisionPolicy | None = None) -> Any:
    """Find (or add) the trainer's ``PrecisionCallback``, bind it, and move it first."""
    handler = trainer.callback_handler
    found = next((cb for cb in handler.callbacks if isinstance(cb, PrecisionCallback)), None)
    if found is None:
        found = PrecisionCallback(policy)
    else:
        handler.callbacks.remove(found)
    handler.callbacks.insert(0, found)
    return found.bind(trainer)
