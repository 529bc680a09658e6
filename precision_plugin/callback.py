"""``PrecisionCallback``: the TrainerCallback for the HF Trainer and every TRL trainer.

Without ``enable()``, ``callbacks=[PrecisionCallback()]`` still checks and fixes what a callback can
reach (flags against the policy, parameter dtypes, the dtype the training forward really ran in) and
logs the loss scale; what only exists inside the trainer (the ``Accelerator``'s mixed precision,
fp16 on CPU) it reports instead of fixing. With ``enable()`` every trainer gets one bound to it
automatically (see ``precision_plugin.transformers``).
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback

from precision_plugin._base.boundary import checked, duck
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._base.patching import track, untrack
from precision_plugin._base.shield import shielded
from precision_plugin._core.manager import call_each_reported, resolve_policy
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

PREFIX = "precision/"


class _ForwardProbe:
    """Records the output dtype of the first ``Linear`` in the first grad-enabled forward
    (``exclude``: modules deliberately run in float32, ``overflow.keep_fp32_modules``)."""

    def __init__(self, model: Any, exclude: frozenset[Any] = frozenset()) -> None:
        import torch

        self.dtype: Any = None
        self._handle = None
        linear = next(
            (m for m in model.modules() if isinstance(m, torch.nn.Linear) and m not in exclude),
            None,
        )
        if linear is not None:
            self._handle = linear.register_forward_hook(self._hook)
            track(self.remove, f"PrecisionCallback: forward-dtype probe on {type(model).__name__}")

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        import torch

        if torch.is_grad_enabled() and module.training and hasattr(output, "dtype"):
            self.dtype = output.dtype
            self.remove()

    def remove(self) -> None:
        untrack(self.remove)
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _no_trainer() -> None:
    return None


def _calling_trainer(callback: TrainerCallback) -> Any:
    """The trainer whose callback handler is calling ``callback`` now, or ``None``.

    Transformers passes callbacks no trainer; the training loop that calls them is a method of
    the trainer, a few frames up, and its callback handler holds ``callback``.
    """
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        handler = getattr(candidate, "callback_handler", None)
        if any(cb is callback for cb in getattr(handler, "callbacks", ())):
            return candidate
        frame = frame.f_back
    return None


@checked
class PrecisionCallback(TrainerCallback):
    """TrainerCallback for the HF Trainer and TRL trainers: checks precision, logs metrics.

    On train begin it runs every adapter's ``precision_train_begin`` hook (flags and model dtypes
    against the policy, a vLLM server's dtype, ...); on the first training step it checks the dtype
    the forward really ran in; on every log it adds the adapters' ``precision_collect_metrics``
    (loss scale, skipped steps, ...) as ``precision/<name>``. ``policy`` (a policy, a dict or a
    dtype name) defaults to [`resolve_policy()`][precision_plugin._core.manager.resolve_policy]'s
    answer.
    The trainer is known when ``enable()`` is on (the plugin binds it) or after
    [`bind`][precision_plugin.callback.PrecisionCallback.bind].

    It never stops training except on purpose (a strict-mode precision error): a problem of its
    own is one warning and the check or metric is skipped. What it changes on the model (fp32
    wrappers, detector and probe hooks) and trainer (telemetry wrappers) is undone at train end,
    by [`release`][precision_plugin.callback.PrecisionCallback.release], by
    ``precision_plugin.disable()``, and when ``train()`` raises: with ``enable()`` through its
    ``Trainer.train`` wrapper, without it through the trainer's own ``train``, which the callback
    wraps when the trainer is built (``on_init_end``; a callback added later with
    ``add_callback`` guards the trainer's following ``train()`` calls).
    """

    def __init__(self, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None) -> None:
        # Resolved once, here. Without a policy this refuses a PRECISION_PLUGIN that says nothing
        # the plugin reads before train(): inside it the callback only warns, and the run would
        # go unchecked.
        resolved = resolve_policy(policy)
        #: The policy given; ``None``: the requested one, read when used (``policy``).
        self._policy = resolved if policy is not None else None
        self._trainer: Callable[[], Any] = _no_trainer
        self._probe: _ForwardProbe | None = None
        #: The dtype the first training forward ran in (``None`` until it ran).
        self.forward_dtype: Any = None
        self._logs_seen = 0
        self._overflow = _OverflowWatch()
        self._args: Any = None
        self._model: Any = None
        #: (the trainer whose ``train`` is guarded, weakly; the patcher of that guard or None)
        self._train_guard: tuple[Callable[[], Any], Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The trainer reference, hooks and the fp32 fallback belong to this process only.
        return {
            **self.__dict__,
            "_trainer": _no_trainer,
            "_probe": None,
            "_overflow": _OverflowWatch(),
            "_model": None,
            "_train_guard": None,
        }

    @property
    def overflow_detector(self) -> Any:
        """The :class:`~precision_plugin._core.overflow.OverflowDetector` of the current (or last)
        run,
        or ``None`` when the policy asks for no detection; closed after train end."""
        return self._overflow.detector

    @property
    def policy(self) -> PrecisionPolicy:
        """The policy this callback enforces."""
        if self._policy is not None:
            return self._policy
        # Ambient on purpose: a callback built without a policy follows the one this process
        # asks for when it runs (the user, TRL or the sanity run builds it, often before
        # enable(), and the HF Trainer calls it with no way to pass a policy through).
        return resolve_policy()

    @property
    def trainer(self) -> Any:
        """The bound trainer, or ``None``."""
        return self._trainer()

    @checked(trainer=duck("callback_handler", "args", what="a transformers Trainer"))
    def bind(self, trainer: Any) -> PrecisionCallback:
        """Give the callback its trainer (held weakly); return the callback."""
        self._trainer = weakref.ref(trainer)
        return self

    def _shield(self, what: str) -> Any:
        """Inside ``train()``: only a strict-mode precision error stops the run."""
        try:
            strictness = self.policy.strictness
        except Exception:  # a policy that cannot be built: its own error, warned once
            strictness = "warn"
        return shielded(f"PrecisionCallback: {what}", strictness)

    def _hooks(self, hook: str, **kwargs: Any) -> list[Any]:
        """The adapters' ``hook``; a refusal stops training only when strictness says so."""
        return call_each_reported(
            hook, policy=self.policy, strictness=self.policy.strictness, **kwargs
        )

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The end of Trainer.__init__: without enable(), bind the trainer being built and guard
        # its train() so an exception inside it undoes this callback's changes.
        self._bind_calling_trainer()

    def _bind_calling_trainer(self) -> None:
        """Bind the trainer calling this callback (without ``enable()`` nothing else does), then
        guard its ``train()`` (see
        [`guard_train`][precision_plugin._core.train_guard.guard_train])."""
        with self._shield("finding the trainer"):
            calling = _calling_trainer(self)
            if calling is not None and calling is not self.trainer:
                if self.trainer is not None:
                    # One callback given to a second trainer: it follows the trainer that is
                    # calling it, whose training forward it has not measured yet.
                    self.forward_dtype = None
                self.bind(calling)
        with self._shield("guarding train() against exceptions"):
            trainer = self.trainer
            guarded, patcher = self._train_guard or (_no_trainer, None)
            if trainer is not None and guarded() is not trainer:
                from precision_plugin._core.train_guard import guard_train

                if patcher is not None:  # the callback moved to another trainer
                    patcher.restore()
                self._train_guard = (weakref.ref(trainer), guard_train(trainer, self.release))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        self._args, self._model = args, model
        self._bind_calling_trainer()
        with self._shield("the train-begin checks"):
            self._hooks(
                "precision_train_begin", args=args, state=state, model=model, trainer=self.trainer
            )
        with self._shield("the fp32 fallback and overflow detection"):
            if model is not None:
                self._overflow.start(model, self.policy)
        with self._shield("the training forward's dtype check"):
            if self._probe is not None:  # left by a run that stopped on an exception
                self._probe.remove()
                self._probe = None
            if model is not None and self.forward_dtype is None:
                self._probe = _ForwardProbe(model, exclude=self._overflow.fp32_modules(model))
        with self._shield("the asked-vs-ran audit"):
            self._run_audit("asked vs ran (train begin)")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._shield("forward-overflow detection"):
            self._overflow.begin_step(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.release()

    def release(self) -> None:
        """Undo what this callback changed for the run: the fp32 fallback, detector and probe
        hooks on the model, the adapters' per-trainer telemetry (``precision_train_end``).
        Called at train end and, with ``enable()``, when ``train()`` raises; safe to call
        again."""
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.remove()
        with self._shield("undoing the run's changes"):
            self._overflow.stop()
        with self._shield("undoing the adapters' per-run changes"):
            self._hooks("precision_train_end", trainer=self.trainer)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The first forward has run and nothing has been stepped yet: check what it ran in.
        if self._probe is not None:
            with self._shield("the training forward's dtype check"):
                self._finish_probe(args)
                self._run_audit("asked vs ran (first step)")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._shield("forward-overflow detection"):
            skips = self._consecutive_skips(kwargs.get("optimizer"))
            self._overflow.end_step(skips, self.policy)
        with self._shield("the training forward's dtype check"):
            self._finish_probe(args)

    def _finish_probe(self, args: Any) -> None:
        probe, self._probe = self._probe, None
        if probe is None:
            return
        probe.remove()
        self.forward_dtype = probe.dtype
        wanted = self.policy.torch_dtype
        if probe.dtype is not None and probe.dtype not in (wanted, self._engine_fallback()):
            _report_forward(self.policy, probe.dtype, args)

    def _engine_fallback(self) -> Any:
        """The dtype a DeepSpeed engine of this run was set to instead of the policy's, because
        its accelerator refuses the policy dtype (reported when it was decided), or ``None``."""
        if not getattr(self.trainer, "is_deepspeed_enabled", False):
            return None
        from precision_plugin.deepspeed import engine_dtype
        from precision_plugin.policy import torch_dtype

        runs = engine_dtype(getattr(self.trainer, "model_wrapped", None))
        return None if runs in (None, self.policy.dtype) else torch_dtype(runs)

    def audit(self) -> dict[str, Any]:
        """What each side was asked to run and what runs: the learner (flags, Accelerate's
        mixed precision, the training forward's dtype, parameter dtypes, loss scaler, DeepSpeed
        section) and the rollout engine, with every contradiction (see
        [`audit_run`][precision_plugin.audit.audit_run])."""
        from precision_plugin.audit import audit_run

        return audit_run(
            self.policy, self._args, self.trainer, self._model, forward_dtype=self.forward_dtype
        )

    def _run_audit(self, title: str) -> None:
        """Log the audit table; settle contradictions (the forward's is settled on its own)."""
        from precision_plugin.audit import fix_of, render

        result = self.audit()
        log.info("precision_plugin %s\n%s", title, render(result, title))
        for kind, message in result["contradictions"].items():
            if kind != "forward":
                fix = fix_of(kind, result, self.policy)
                settle_conflict(self.policy.strictness, message, fix=fix, outcome=f"fix: {fix}")

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        if logs is None:
            return
        # Mismatch metrics follow policy.metrics (enabled, every log_every-th log); the loss
        # scaler's telemetry is logged every time.
        with self._shield("the precision/* metrics of this log"):
            settings = self.policy.metrics
            due = settings.enabled and self._logs_seen % settings.log_every == 0
            self._logs_seen += 1
            metrics = self.collect(optimizer=kwargs.get("optimizer"), logs=logs, mismatch_due=due)
            if not metrics:
                return
            logs.update(metrics)
            if state.log_history:  # Trainer.log appended a copy of `logs` just before on_log
                state.log_history[-1].update(metrics)

    def _consecutive_skips(self, optimizer: Any) -> int:
        """The loss scaler's current run of skipped steps (0 when there is no scaler)."""
        if not self._overflow.diagnoses:
            return 0
        from precision_plugin._core.scaler import consecutive_skips

        accelerator = getattr(self.trainer, "accelerator", None)
        for scaler in (getattr(optimizer, "scaler", None), getattr(accelerator, "scaler", None)):
            count = consecutive_skips(scaler)  # no device sync
            if count is not None:
                return count
        if not getattr(self.trainer, "is_deepspeed_enabled", False):
            return 0  # a torch scaler without telemetry does not count skips
        # DeepSpeed's engine runs its own scaler; its adapter reports the count. No mismatch
        # metrics: they are gathered across processes at logging steps only.
        results = self._hooks(
            "precision_collect_metrics",
            trainer=self.trainer,
            logs={},
            optimizer=optimizer,
            mismatch_due=False,
        )
        return max((int(r.get("consecutive_skips", 0)) for r in results if r), default=0)

    def collect(
        self,
        optimizer: Any = None,
        logs: Mapping[str, Any] | None = None,
        mismatch_due: bool = True,
    ) -> dict[str, float]:
        """The ``precision/<name>`` metrics to log now: every adapter's
        ``precision_collect_metrics`` (loss scaler telemetry; with ``mismatch_due``, the
        train/rollout mismatch), merged, the first-registered adapter winning a name clash."""
        merged: dict[str, float] = {}
        results = self._hooks(
            "precision_collect_metrics",
            trainer=self.trainer,
            logs=logs if logs is not None else {},
            optimizer=optimizer,
            mismatch_due=mismatch_due,
        )
        for result in reversed(results):  # first-registered adapter wins a name clash
            merged.update(result or {})
        return {PREFIX + k: float(v) for k, v in merged.items()}


class _OverflowWatch:
    """The overflow side of the callback: the fp32 fallback, runtime detection, and the one-off
    check after repeated loss-scaler skips that tells forward from gradient overflow."""

    def __init__(self) -> None:
        self.detector: Any = None
        self.fallback: Any = None
        self.diagnoses = False
        self._diagnosing = False
        self._streak_checked = False
        self._skips_seen = 0

    def start(self, model: Any, policy: PrecisionPolicy) -> None:
        self.stop()
        self.detector = None
        settings = policy.overflow
        _audit_model_type(model, policy)
        if settings.keep_fp32_modules:
            from precision_plugin._core.overflow import keep_fp32_modules

            self.fallback = keep_fp32_modules(model, settings.keep_fp32_modules)
        self.diagnoses = policy.uses_loss_scaler and settings.diagnose_after_skips > 0
        if settings.detect != "off" or self.diagnoses:
            from precision_plugin._core.overflow.detect import detector_for

            self.detector = detector_for(model, policy)

    def fp32_modules(self, model: Any) -> frozenset[Any]:
        """Every module the float32 fallback runs (the matched ones and their submodules)."""
        if self.fallback is None:
            return frozenset()
        return frozenset(
            sub for name in self.fallback.modules for sub in model.get_submodule(name).modules()
        )

    def begin_step(self, step: int) -> None:
        if self.detector is not None:
            self.detector.begin_step(step)

    def end_step(self, consecutive_skips: int, policy: PrecisionPolicy) -> None:
        if self.detector is None:
            return
        diagnosing, self._diagnosing = self._diagnosing, False
        found = self.detector.end_step()  # reports (raises under strictness="error") itself
        if diagnosing and found is None and self.detector.last_checked is not None:
            log.warning(
                "precision_plugin: the loss scaler skipped %d steps in a row; step %d's forward "
                "was checked and is finite in every module, so these are gradient overflows: "
                "the scaler lowers the scale until they fit. If the skips go on, lower the "
                "learning rate or run consistent bf16 (enable(dtype='bfloat16')).",
                self._skips_seen,
                self.detector.last_checked[0],
            )
        if consecutive_skips == 0:
            self._streak_checked = False
        elif (
            self.diagnoses
            and not self._streak_checked
            and consecutive_skips >= policy.overflow.diagnose_after_skips
        ):
            self._streak_checked = True
            self._diagnosing = True
            self._skips_seen = consecutive_skips
            self.detector.check_next_step()
            log.info(
                "precision_plugin: %d skipped steps in a row; checking the next step's forward "
                "for overflow",
                consecutive_skips,
            )

    def stop(self) -> None:
        if self.detector is not None:
            self.detector.close()  # kept (closed) so its events stay readable after train()
        if self.fallback is not None:
            self.fallback.remove()
            self.fallback = None
        self._diagnosing = self._streak_checked = False


def _audit_model_type(model: Any, policy: PrecisionPolicy) -> None:
    """Warn when the model's ``model_type`` is on the known float16-risk lists (vLLM's refusals,
    families known to overflow), saying what measures it for this model."""
    config = getattr(model, "config", None)
    if not policy.is_fp16 or not hasattr(config, "to_dict"):
        return
    from precision_plugin._core.model_risks import model_findings

    findings = model_findings(config.to_dict(), policy, raise_on_refusal=False)
    if policy.overflow.detect == "off":
        measured = (
            "nothing measures it in this run: set overflow.detect='sampled' to name a module "
            "whose forward overflows"
        )
    else:
        measured = f"overflow.detect={policy.overflow.detect!r} checks the forwards of this run"
    for finding in findings:
        if finding.status in ("warning", "error"):
            log.warning(
                "precision_plugin: %s (a list by model_type); %s, and `precision-plugin probe "
                "--model PATH` measures each module's float16 headroom. Fix if it overflows: %s",
                finding.message.rstrip("."),
                measured,
                finding.fix,
            )


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
