"""Loss-scale telemetry of DeepSpeed engines and the policy's floor rule.

DeepSpeed has no per-step callback, so [`track_engine`][precision_plugin.deepspeed.track_engine]
wraps one engine's ``step`` to count consecutive skipped steps and apply
[`check_scale_floor`][precision_plugin._core.scaler.check_scale_floor] instead of DeepSpeed's own
"already
at minimum ... Exiting run."
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from precision_plugin._base.boundary import checked, duck
from precision_plugin._base.patching import Patcher
from precision_plugin._base.shield import shielded
from precision_plugin._core.manager import adapter_patcher, current_policy, resolve_policy
from precision_plugin._core.scaler import ScalerStats, check_scale_floor
from precision_plugin.deepspeed.api import config_policy
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: What a DeepSpeed engine is, for the boundary (DeepSpeed is not imported to check a class).
_ENGINE = duck(
    "step",
    "global_steps",
    "optimizer",
    what="the DeepSpeed engine deepspeed.initialize() returned (its first element)",
)
_TELEMETRY = "DeepSpeed loss-scale telemetry (precision/skipped_steps, the floor check)"

#: Attribute of a tracked engine holding its tracker (set and removed through the patcher).
_TRACKER = "__precision_plugin_tracker__"


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

    def __init__(self, policy: PrecisionPolicy, patcher: Patcher) -> None:
        self.policy = policy
        self.patcher = patcher
        self.consecutive_skips = 0

    def before_step(self, engine: Any) -> tuple[int, int]:
        # Checked before every step because load_checkpoint replaces the scaler object.
        scaler = getattr(engine.optimizer, "loss_scaler", None)
        if getattr(scaler, "raise_error_at_min_scale", False):
            self.patcher.setattr(
                scaler,
                "raise_error_at_min_scale",
                False,
                reason="DeepSpeed's ZeRO scaler raises a bare Exception on the first overflow "
                "at its floor; the policy (loss_scaler.on_min_scale / max_skips_at_min) decides",
            )
        return engine.global_steps, engine.skipped_steps

    def around_step(
        self, engine: Any, original: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``engine.step`` with the skip count and the floor check around it (only the floor
        check, under ``on_min_scale="error"``, may stop training)."""
        before = None
        with shielded(_TELEMETRY, self.policy.strictness):
            before = self.before_step(engine)
        result = original(*args, **kwargs)
        if before is not None:
            with shielded(_TELEMETRY, self.policy.strictness):
                self.after_step(engine, before)
        return result

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


@checked(engine=_ENGINE)
def engine_scaler_stats(engine: Any) -> ScalerStats:
    """The loss-scaler state of a DeepSpeed engine (any ZeRO stage, fp16/bf16/fp32).

    ``scale`` is the optimizer's current loss scale; ``steps``/``skipped_steps`` are
    ``engine.global_steps``/``engine.skipped_steps`` (restored by ``load_checkpoint``);
    ``overflow_count`` equals ``skipped_steps`` (DeepSpeed skips every overflowing step; its
    hysteresis only delays the scale cut). ``consecutive_skips`` is exact for tracked engines
    ([`track_engine`][precision_plugin.deepspeed.track_engine]) and otherwise 1 or 0 from the last
    step.
    """
    scale, floor = _loss_scale_and_floor(getattr(engine, "optimizer", None))
    steps = int(getattr(engine, "global_steps", 0))
    skipped = int(getattr(engine, "skipped_steps", 0))
    tracker = tracker_of(engine)
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


@checked
def engine_dtype(engine: Any) -> str | None:
    """The dtype the plugin runs ``engine`` in: the policy's, or float32 where DeepSpeed's
    accelerator refuses the policy dtype (``None`` for an engine the plugin does not track)."""
    tracker = tracker_of(engine)
    return tracker.policy.dtype if tracker is not None else None


@checked
def tracker_of(engine: Any) -> _EngineTracker | None:
    """The tracker [`track_engine`][precision_plugin.deepspeed.track_engine] gave ``engine``."""
    try:
        return vars(engine).get(_TRACKER)
    except TypeError:
        return None


@checked(engine=_ENGINE)
def track_engine(
    engine: Any, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> Any:
    """Give ``engine`` per-step telemetry and the policy's loss-scale-floor behaviour; return it.

    Wraps this engine's ``step`` (the instance, not the class) so consecutive skips are counted and
    [`check_scale_floor`][precision_plugin._core.scaler.check_scale_floor] runs on the floor
    condition,
    instead of DeepSpeed's "Current loss scale already at minimum ... Exiting run." ``enable()``
    calls it for every engine ``deepspeed.initialize`` returns; without ``enable()`` the wrap stays
    until the engine is gone.
    """
    if tracker_of(engine) is not None:
        return engine
    if policy is not None:
        return track(engine, resolve_policy(policy))
    # No policy given: the one enable() installed, else the engine's own config entry over the
    # requested policy (an engine built without enable(), or before it).
    return track(engine, current_policy() or _policy_of(engine))


def track(engine: Any, policy: PrecisionPolicy) -> Any:
    """[`track_engine`][precision_plugin.deepspeed.track_engine] for a resolved ``policy``
    (``deepspeed.initialize`` under ``enable()``)."""
    if tracker_of(engine) is not None:
        return engine
    # Under enable() the wrap is undone by disable(); without it, it lives as long as the engine.
    patcher = adapter_patcher("deepspeed") or Patcher(owner="precision_plugin[deepspeed]")
    tracker = _EngineTracker(policy, patcher)
    patcher.setattr(engine, _TRACKER, tracker, reason="the engine's step counts live with it")
    patcher.around(
        engine,
        "step",
        functools.partial(tracker.around_step, engine),
        reason="DeepSpeed has no per-step callback; the loss-scale floor check and the "
        "consecutive-skip count need one",
    )
    _apply_scale_factor(engine, policy)
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
    return config_policy(raw if isinstance(raw, dict) else {})


@checked
def find_engine(trainer: Any) -> Any:
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
    if trainer is None:  # the newest engine enable() tracked
        patcher = adapter_patcher("deepspeed")
        tracked = patcher.targets(_TRACKER) if patcher is not None else []
        return tracked[-1] if tracked else None
    return None
