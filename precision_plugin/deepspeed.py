"""DeepSpeed adapter: the ``"precision_plugin"`` config entry, applied wherever DeepSpeed starts.

Public API:

- :func:`apply_config` (pure): a DeepSpeed config with its ``"precision_plugin"`` section turned
  into DeepSpeed's own ``fp16``/``bf16`` settings (see :mod:`precision_plugin.deepspeed_config`).
- :func:`engine_scaler_stats`: the engine's loss scale and skipped steps as a
  :class:`~precision_plugin.scaler.ScalerStats`, whatever the ZeRO stage.
- :func:`track_engine`: per-step telemetry and the loss-scale-floor check for one engine
  (``enable()`` does it for every engine ``deepspeed.initialize`` builds).

After ``enable()``, the entry is applied by ``deepspeed.initialize`` itself, whether it is
called directly (``config=`` dict or path, or ``args.deepspeed_config``), by Accelerate
(``DeepSpeedPlugin``, ``accelerator.prepare``) or by the HF Trainer (``--deepspeed file.json``);
the HF Trainer's and Accelerate's own precision requests are reconciled with the policy first.
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from precision_plugin.deepspeed_config import (
    SECTION,
    apply_config,
    load_config,
    resolve_policy,
    translate,
)
from precision_plugin.errors import settle_conflict
from precision_plugin.hookspecs import hookimpl
from precision_plugin.patching import Patcher
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.report import Finding
from precision_plugin.scaler import ScalerStats, check_scale_floor
from precision_plugin.versions import installed_version

__all__ = ["SECTION", "apply_config", "engine_scaler_stats", "track_engine"]

log = logging.getLogger("precision_plugin")

_Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass
class _State:
    policy: PrecisionPolicy
    patcher: Patcher


_state: _State | None = None
#: Engines built (or tracked) while the plugin is on, newest last: the metrics fallback.
_engines: weakref.WeakKeyDictionary[Any, _EngineTracker] = weakref.WeakKeyDictionary()


# -- telemetry -------------------------------------------------------------------------------
def _loss_scale_and_floor(optimizer: Any) -> tuple[float, float | None]:
    """Current scale and floor of the engine's optimizer, for every DeepSpeed optimizer kind.

    ``FP16_Optimizer``/``FP16_UnfusedOptimizer`` (ZeRO-0) keep them in ``loss_scale_config``;
    ZeRO-1/2/3 optimizers in a ``DynamicLossScaler`` (``loss_scaler.cur_scale``/``min_scale``);
    both expose ``loss_scale`` (which honours ``override_loss_scale``). bf16/fp32 optimizers
    have no dynamic scaler: scale 1, no floor.
    """
    if optimizer is None:
        return 1.0, None
    config = getattr(optimizer, "loss_scale_config", None)
    scaler = getattr(optimizer, "loss_scaler", None)
    if config is not None and getattr(config, "dynamic_loss_scale", False):
        floor = config.min_loss_scale
    elif scaler is not None and getattr(scaler, "dynamic", False):
        floor = getattr(scaler, "min_scale", None)
    else:
        floor = None
    scale = getattr(optimizer, "loss_scale", None)
    if scale is None:
        scale = getattr(optimizer, "cur_scale", None)
    if scale is None and scaler is not None:
        scale = getattr(scaler, "cur_scale", None)
    return float(scale if scale is not None else 1.0), floor


class _EngineTracker:
    """Counts consecutive skipped steps of one engine and applies the scale-floor policy."""

    def __init__(self, policy: PrecisionPolicy) -> None:
        self.policy = policy
        self.consecutive_skips = 0
        self._silenced: weakref.WeakSet[Any] = weakref.WeakSet()

    def before_step(self, engine: Any) -> tuple[int, int]:
        # DeepSpeed's ZeRO scaler raises a bare Exception on the first overflow at its floor;
        # the policy (loss_scaler.on_min_scale / max_skips_at_min) decides instead. Checked
        # before every step because load_checkpoint replaces the scaler object.
        scaler = getattr(engine.optimizer, "loss_scaler", None)
        if getattr(scaler, "raise_error_at_min_scale", False):
            scaler.raise_error_at_min_scale = False
            self._silenced.add(scaler)
        return engine.global_steps, engine.skipped_steps

    def release(self) -> None:
        """Give DeepSpeed its own abort at the floor back: the floor check leaves with disable().

        Not a Patcher record: the patcher names its targets by ``repr``, which DeepSpeed's
        scalers cannot produce (their config ``__repr__`` fails on torch dtypes).
        """
        for scaler in list(self._silenced):
            scaler.raise_error_at_min_scale = True
        self._silenced = weakref.WeakSet()

    def after_step(self, engine: Any, before: tuple[int, int]) -> None:
        steps, skipped = before
        if engine.global_steps == steps:
            return  # gradient accumulation: no optimizer step was taken
        if engine.skipped_steps > skipped:
            self.consecutive_skips += 1
        else:
            self.consecutive_skips = 0
        settings = self.policy.loss_scaler
        if self.consecutive_skips:
            check_scale_floor(engine_scaler_stats(engine), settings, backend="DeepSpeed")


def engine_scaler_stats(engine: Any) -> ScalerStats:
    """The loss-scaler state of a DeepSpeed engine (any ZeRO stage, fp16/bf16/fp32).

    ``scale`` is the optimizer's current loss scale; ``steps``/``skipped_steps`` are
    ``engine.global_steps``/``engine.skipped_steps`` (restored by ``load_checkpoint``);
    ``overflow_count`` equals ``skipped_steps`` (DeepSpeed skips every overflowing step; its
    hysteresis only delays the scale cut). ``consecutive_skips`` is exact for tracked engines
    (:func:`track_engine`) and otherwise 1 or 0 from the last step.
    """
    scale, floor = _loss_scale_and_floor(getattr(engine, "optimizer", None))
    steps = int(getattr(engine, "global_steps", 0))
    skipped = int(getattr(engine, "skipped_steps", 0))
    tracker = _engines.get(engine)
    if tracker is not None:
        consecutive = tracker.consecutive_skips
    else:
        applied = getattr(engine, "was_step_applied", None)
        consecutive = int(steps > 0 and callable(applied) and not applied())
    return ScalerStats(
        scale=scale,
        steps=steps,
        skipped_steps=skipped,
        consecutive_skips=consecutive,
        overflow_count=skipped,
        at_min_scale=floor is not None and scale <= floor,
    )


def _wrap_step(tracker: _EngineTracker, engine: Any) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            before = tracker.before_step(engine)
            result = original(*args, **kwargs)
            tracker.after_step(engine, before)
            return result

        return step

    return make


def track_engine(engine: Any, policy: PrecisionPolicy | None = None) -> Any:
    """Give ``engine`` per-step telemetry and the policy's loss-scale-floor behaviour; return it.

    Wraps this engine's ``step`` (the instance, not the class) so consecutive skips are counted
    and :func:`~precision_plugin.scaler.check_scale_floor` runs on the floor condition, instead
    of DeepSpeed's "Current loss scale already at minimum ... Exiting run." ``enable()`` calls
    it for every engine ``deepspeed.initialize`` returns; without ``enable()`` the wrap stays
    until the engine is gone.
    """
    if engine in _engines:
        return engine
    state = _state
    pol = policy or (state.policy if state else None) or _policy_of(engine)
    patcher = state.patcher if state is not None else Patcher(owner="precision_plugin[deepspeed]")
    tracker = _EngineTracker(pol)
    patcher.wrap(
        engine,
        "step",
        _wrap_step(tracker, engine),
        reason="DeepSpeed has no per-step callback; the loss-scale floor check and the "
        "consecutive-skip count need one",
    )
    _engines[engine] = tracker
    _apply_scale_factor(engine, pol)
    return engine


def _apply_scale_factor(engine: Any, policy: PrecisionPolicy) -> None:
    """DeepSpeed's config has no scale factor (one factor, default 2, both ways): set it here."""
    settings = policy.loss_scaler
    if not policy.uses_loss_scaler or settings.growth_factor == 2.0 == 1 / settings.backoff_factor:
        return
    optimizer = getattr(engine, "optimizer", None)
    holder = getattr(optimizer, "loss_scale_config", None) or getattr(
        optimizer, "loss_scaler", None
    )
    if holder is None or not hasattr(holder, "scale_factor"):
        return
    if abs(settings.growth_factor * settings.backoff_factor - 1) > 1e-9:
        log.warning(
            "precision_plugin: DeepSpeed grows and backs off the loss scale by one factor; "
            "loss_scaler.growth_factor=%g with backoff_factor=%g cannot both apply. DeepSpeed "
            "uses %g both ways. Fix: set backoff_factor=1/growth_factor.",
            settings.growth_factor,
            settings.backoff_factor,
            settings.growth_factor,
        )
    holder.scale_factor = settings.growth_factor


def _policy_of(engine: Any) -> PrecisionPolicy:
    raw = getattr(engine, "config", None)
    return resolve_policy(raw if isinstance(raw, dict) else {})


def _find_engine(trainer: Any) -> Any:
    """The DeepSpeed engine a trainer (or the last tracked engine) runs, else ``None``."""
    ds = sys.modules.get("deepspeed")
    if ds is None:  # DeepSpeed was never imported: no engine can exist
        return None
    engine_cls = getattr(ds, "DeepSpeedEngine", None)
    candidates = [
        getattr(trainer, "model_wrapped", None),
        getattr(trainer, "deepspeed", None),
        getattr(
            getattr(getattr(trainer, "accelerator", None), "deepspeed_engine_wrapped", None),
            "engine",
            None,
        ),
        trainer,
    ]
    for candidate in candidates:
        if engine_cls is not None and isinstance(candidate, engine_cls):
            return candidate
    if trainer is None and len(_engines):
        return list(_engines.keys())[-1]
    return None


# -- automatic application ---------------------------------------------------------------------
def _wrap_initialize(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def initialize(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs)
            arguments = bound.arguments
            resolved = policy
            ds_args = arguments.get("args")
            ds_path = getattr(ds_args, "deepspeed_config", None)
            if ds_path is not None:
                # DeepSpeed reads args.deepspeed_config and asserts config is None: hand it the
                # applied dict instead, on a copy of args so the caller's object is untouched.
                ds_args = copy.copy(ds_args)
                ds_args.deepspeed_config = None
                arguments["args"] = ds_args
                arguments.pop("config_params", None)
                key, raw = "config", ds_path
            else:
                key = "config" if arguments.get("config") is not None else "config_params"
                raw = arguments.get(key)
            if raw is not None:
                cfg = load_config(raw)
                resolved = resolve_policy(cfg, policy)
                arguments[key] = translate(cfg, resolved)
            result = original(*bound.args, **bound.kwargs)
            track_engine(result[0], resolved)
            return result

        return initialize

    return make


def _wrap_hf_config_init(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            self.config = apply_config(self.config, policy)

        return __init__

    return make


_PRECISION_MISMATCH = ("- ds fp16.enabled=", "- ds bf16.enabled=")


def _wrap_trainer_config_process(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def trainer_config_process(self: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            result = original(self, args, *rest, **kwargs)
            # The config already follows the policy; HF recorded its fp16/bf16 flags as
            # mismatches that would raise at train(). The policy settles them here.
            ours = [m for m in self.mismatches if m.startswith(_PRECISION_MISMATCH)]
            if ours:
                pol = resolve_policy(self.config, policy)
                message = (
                    f"TrainingArguments fp16={args.fp16}, bf16={args.bf16} contradict the "
                    f"precision policy (dtype={pol.dtype!r}) that the DeepSpeed config follows "
                    f"({'; '.join(m[2:] for m in ours)})"
                )
                flags = "fp16=True, bf16=False" if pol.is_fp16 else "bf16=True, fp16=False"
                settle_conflict(
                    pol.strictness,
                    message,
                    fix=f"pass {flags} (TRL configs default to bf16=True), or use "
                    "strictness='warn'",
                    outcome=f"DeepSpeed runs {pol.dtype}",
                )
                self.mismatches = [m for m in self.mismatches if m not in ours]
            self._dtype = resolve_policy(self.config, policy).torch_dtype
            return result

        return trainer_config_process

    return make


def _wrap_set_mixed_precision(policy: PrecisionPolicy) -> _Wrapper:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def set_mixed_precision(self: Any, mixed_precision: Any, *args: Any, **kwargs: Any) -> Any:
            pol = resolve_policy(self.deepspeed_config, policy)
            wanted = pol.mixed_precision
            if mixed_precision not in (None, "no", wanted):
                message = (
                    f"Accelerate mixed_precision={mixed_precision!r} contradicts the precision "
                    f"policy (dtype={pol.dtype!r}) that the DeepSpeed config follows"
                )
                settle_conflict(
                    pol.strictness,
                    message,
                    fix=f"use mixed_precision={wanted!r} (accelerate config / --mixed_precision), "
                    "or strictness='warn'",
                    outcome=f"DeepSpeed runs {pol.dtype}",
                )
            return original(self, wanted, *args, **kwargs)

        return set_mixed_precision

    return make


def _ds_available() -> bool:
    return installed_version("deepspeed") is not None


@hookimpl
def precision_adapter_name() -> str:
    """This adapter's short name."""
    return "deepspeed"


def _patch_deepspeed(deepspeed: Any, policy: PrecisionPolicy, patcher: Patcher) -> None:
    patcher.wrap(
        deepspeed,
        "initialize",
        _wrap_initialize(policy),
        reason="DeepSpeed has no config or engine hook; Accelerate, TRL and HF look "
        "deepspeed.initialize up at call time, so one wrap covers every caller",
    )


def _patch_hf_trainer_config(module: Any, policy: PrecisionPolicy, patcher: Patcher) -> None:
    cls = getattr(module, "HfTrainerDeepSpeedConfig", None)
    if cls is None or not hasattr(cls, "trainer_config_process"):
        log.info(
            "precision_plugin: transformers has no HfTrainerDeepSpeedConfig.trainer_config_process;"
            " the HF Trainer's fp16/bf16 flags are left to transformers"
        )
        return
    patcher.wrap(
        cls,
        "trainer_config_process",
        _wrap_trainer_config_process(policy),
        reason="the HF Trainer fills fp16/bf16 from TrainingArguments and raises on any "
        "difference at train(); the policy must settle them",
    )


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Apply the config entry in ``deepspeed.initialize`` and where HF/Accelerate build configs."""
    global _state
    if not _ds_available():
        return
    patcher.when_imported(
        "deepspeed",
        lambda module: _patch_deepspeed(module, policy, patcher),
        reason="importing DeepSpeed in enable() is slow and logs to stdout; Accelerate, TRL "
        "and HF import it only when they start an engine",
    )
    if installed_version("accelerate") is not None:
        _patch_accelerate_on_import(policy, patcher)
    if installed_version("transformers") is not None:
        patcher.when_imported(
            "transformers.integrations.deepspeed",
            lambda module: _patch_hf_trainer_config(module, policy, patcher),
            reason="enable() imports no framework",
        )
    _state = _State(policy, patcher)


def _patch_accelerate_on_import(policy: PrecisionPolicy, patcher: Patcher) -> None:
    patcher.when_imported(
        "accelerate.utils.deepspeed",
        lambda module: patcher.wrap(
            module.HfDeepSpeedConfig,
            "__init__",
            _wrap_hf_config_init(policy),
            reason="Accelerate and the HF Trainer read fp16/bf16 from this object long before "
            "deepspeed.initialize; it must already follow the policy",
        ),
        reason="enable() imports no framework",
    )
    patcher.when_imported(
        "accelerate.utils.dataclasses",
        lambda module: patcher.wrap(
            module.DeepSpeedPlugin,
            "set_mixed_precision",
            _wrap_set_mixed_precision(policy),
            reason="Accelerate raises when its mixed_precision contradicts the DeepSpeed "
            "config; under the policy the config is right and the request is reconciled",
        ),
        reason="enable() imports no framework",
    )


@hookimpl
def precision_uninstall(policy: PrecisionPolicy) -> None:
    """Forget the active policy (patches and the import hook are restored by the manager)."""
    global _state
    _state = None
    for tracker in list(_engines.values()):
        tracker.release()
    _engines.clear()


@hookimpl
def precision_collect_metrics(policy: PrecisionPolicy, trainer: Any) -> dict[str, float] | None:
    """``loss_scale``, ``skipped_steps``, ... of the trainer's DeepSpeed engine."""
    engine = _find_engine(trainer)
    if engine is None:
        return None
    return engine_scaler_stats(engine).as_metrics()


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:
    """DeepSpeed's version, what ``enable()`` changes, and whether this device can run fp16."""
    version = installed_version("deepspeed")
    if version is None:
        return None
    findings = [Finding("deepspeed", "info", f"deepspeed {version} installed")]
    mapped = apply_config({}, policy)
    shown = {k: mapped[k] for k in ("fp16", "bf16") if k in mapped}
    findings.append(
        Finding(
            "deepspeed",
            "change",
            f"deepspeed.initialize (direct, Accelerate, HF Trainer) applies the "
            f'"{SECTION}" config entry: {shown}; conflicting fp16/bf16/torch_autocast settings '
            + ("are refused" if policy.strictness == "error" else "are coerced with a warning"),
            details={"config": shown},
        )
    )
    if policy.uses_loss_scaler:
        findings.append(
            Finding(
                "deepspeed",
                "change",
                f"a loss scale stuck at its floor ({policy.loss_scaler.min_scale:g}) for "
                f"{policy.loss_scaler.max_skips_at_min} skipped steps "
                + (
                    "stops the run with an actionable error"
                    if policy.loss_scaler.on_min_scale == "error"
                    else "logs a warning and continues"
                )
                + " (DeepSpeed alone exits on the first overflow at the floor); "
                "precision/loss_scale and precision/skipped_steps are logged",
            )
        )
        findings.extend(_device_findings(policy))
    return findings


def _device_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Whether DeepSpeed's accelerator says it supports fp16 (CPUs often do not)."""
    if "deepspeed" not in sys.modules:
        return []  # importing DeepSpeed only to ask is slow and noisy; ask when it is loaded
    try:
        from deepspeed.accelerator import get_accelerator

        acc = get_accelerator()
        if acc.is_fp16_supported():
            return [Finding("deepspeed", "ok", f"{acc.device_name()} supports fp16 in DeepSpeed")]
    except Exception as exc:
        return [Finding("deepspeed", "warning", f"could not query DeepSpeed's accelerator: {exc}")]
    return [
        Finding(
            "deepspeed",
            "warning",
            f"DeepSpeed's {acc.device_name()} accelerator reports no fp16 support: engines with "
            f"fp16 enabled stop with 'Type fp16 is not supported on your device'",
            fix="run on a GPU, or on a CPU with AVX512-FP16/AMX-FP16; or enable(dtype='bfloat16')",
        )
    ]
