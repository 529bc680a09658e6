"""Loss scalers: the backend-neutral telemetry snapshot, the scale-floor check, and the factory
and telemetry for torch ``GradScaler`` (DeepSpeed's scaler is observed by the DeepSpeed adapter).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from precision_plugin._base.boundary import checked, non_empty, torch_device
from precision_plugin._core.frameworks import grad_scaler
from precision_plugin.errors import LossScaleAtMinimumError, PrecisionConfigError
from precision_plugin.policy import LossScalerSettings, PrecisionPolicy

log = logging.getLogger("precision_plugin")


@checked
@dataclass(frozen=True)
class ScalerStats:
    """A snapshot of a dynamic loss scaler, whatever backend runs it.

    ``steps`` counts optimizer steps attempted; ``skipped_steps`` those dropped for inf/NaN
    gradients; ``consecutive_skips`` the current run of skips; ``overflow_count`` every overflow
    seen (DeepSpeed's hysteresis may absorb one without a skip); ``at_min_scale`` is true when
    the scale sits at the policy's floor.
    """

    scale: float
    steps: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    overflow_count: int = 0
    at_min_scale: bool = False

    def as_metrics(self) -> dict[str, float]:
        """Metrics without prefix; ``PrecisionCallback`` logs them as ``precision/<name>``."""
        return {
            "loss_scale": float(self.scale),
            "skipped_steps": float(self.skipped_steps),
            "consecutive_skips": float(self.consecutive_skips),
            "overflow_count": float(self.overflow_count),
        }

    def to_dict(self) -> dict[str, float | int | bool]:
        """Plain-dict form (for checkpoints and JSON)."""
        return asdict(self)


@checked(backend=non_empty("the backend's name, e.g. 'torch'"))
def check_scale_floor(stats: ScalerStats, settings: LossScalerSettings, *, backend: str) -> bool:
    """Act when the scale is stuck at its floor: the run only skips steps, it no longer learns.

    Backends call it after every skipped step. It acts when the scale is at its floor and the run of
    consecutive skips reaches ``settings.max_skips_at_min`` (and again at every further multiple of
    it, so ``"warn"`` does not log on every step): ``on_min_scale="error"`` raises
    [`LossScaleAtMinimumError`][precision_plugin.errors.LossScaleAtMinimumError]; ``"warn"`` logs a
    warning and returns ``True``. Returns ``False`` when it did not act.
    """
    n, every = stats.consecutive_skips, settings.max_skips_at_min
    if not (stats.at_min_scale and n >= every and n % every == 0):
        return False
    message = (
        f"precision_plugin: the {backend} loss scale is stuck at its minimum "
        f"({stats.scale:g}) and the last {stats.consecutive_skips} steps all overflowed "
        f"(inf/NaN gradients): the run is skipping every step, not learning. Usual causes: a "
        f"model that overflows fp16 in the forward pass (activations > 65504), a learning rate "
        f"that blew up the weights, or fp16 weights being unscaled. Fixes: check the loss for "
        f"inf/NaN, lower the learning rate, keep master weights in fp32 "
        f"(precision_plugin.prepare_model), or run this model in consistent bf16 "
        f"(enable(dtype='bfloat16')). To keep going anyway set "
        f"loss_scaler.on_min_scale='warn'."
    )
    if settings.on_min_scale == "error":
        raise LossScaleAtMinimumError(message)
    log.warning(message)
    return True


# -- torch GradScaler telemetry ----------------------------------------------------------------

#: Key under which telemetry counters ride along in ``GradScaler.state_dict()``. torch's
#: ``load_state_dict`` reads only its own keys, so a plain scaler loads these checkpoints too.
STATE_KEY = "precision_plugin_telemetry"


class _Telemetry:
    """Mixin for a torch ``GradScaler``: counts steps and skips, enforces the policy's floor.

    Cost per optimizer step: one ``item()`` per ``found_inf`` tensor (already computed, and
    already synchronised by ``GradScaler.step``), a few integer updates, and one in-place clamp.
    The scale itself is read only when a skip streak is long enough to matter.
    """

    _pp_settings: LossScalerSettings
    _pp_steps: int
    _pp_skipped: int
    _pp_consecutive: int

    def _pp_init(self, settings: LossScalerSettings) -> None:
        self._pp_settings = settings
        self._pp_steps = 0
        self._pp_skipped = 0
        self._pp_consecutive = 0

    def update(self, new_scale: Any = None) -> None:
        """``GradScaler.update`` plus bookkeeping (see the class docstring)."""
        found = 0.0
        if new_scale is None and self._enabled:  # type: ignore[attr-defined]
            # Read before super().update(): it sums the found_inf tensors in place.
            for state in self._per_optimizer_states.values():  # type: ignore[attr-defined]
                for found_inf in state["found_inf_per_device"].values():
                    found += float(found_inf.item())
        super().update(new_scale)  # type: ignore[misc]
        if new_scale is not None or not self._enabled:  # type: ignore[attr-defined]
            return
        self._pp_steps += 1
        if found:
            self._pp_skipped += 1
            self._pp_consecutive += 1
            # torch has no floor (its scale may sink below 1, towards 0); DeepSpeed's min_loss_scale
            # semantics keep the two backends comparable.
            self._scale.clamp_(min=self._pp_settings.min_scale)  # type: ignore[attr-defined]
            check_scale_floor(self.precision_stats(), self._pp_settings, backend="torch")
        else:
            self._pp_consecutive = 0

    def precision_stats(self) -> ScalerStats:
        """The current [`ScalerStats`][precision_plugin._core.scaler.ScalerStats] (reads the scale:
        one
        device sync)."""
        scale = float(self.get_scale()) if self._enabled else 1.0  # type: ignore[attr-defined]
        return ScalerStats(
            scale=scale,
            steps=self._pp_steps,
            skipped_steps=self._pp_skipped,
            consecutive_skips=self._pp_consecutive,
            overflow_count=self._pp_skipped,
            at_min_scale=scale <= self._pp_settings.min_scale,
        )

    def state_dict(self) -> dict[str, Any]:
        """torch's scaler state plus the telemetry counters (under ``STATE_KEY``)."""
        state = super().state_dict()  # type: ignore[misc]
        if state:
            state[STATE_KEY] = {
                "steps": self._pp_steps,
                "skipped_steps": self._pp_skipped,
                "consecutive_skips": self._pp_consecutive,
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load torch's scaler state and, when present, the telemetry counters.

        torch's own keys (the loss scale and its settings) are checked first: a missing or
        damaged one raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError]
        naming it, and nothing is loaded. A missing or damaged telemetry counter never costs the
        loss scale: the scale loads, that counter restarts at 0, and a warning names the key.
        """
        if not isinstance(state_dict, Mapping):
            raise PrecisionConfigError(
                f"GradScaler.load_state_dict: expected the dict scaler.state_dict() returned, "
                f"got {type(state_dict).__name__}."
            )
        if self._enabled and state_dict:  # type: ignore[attr-defined]
            _check_torch_state(state_dict)
        super().load_state_dict(state_dict)  # type: ignore[misc]
        if STATE_KEY not in state_dict:
            return
        counters = state_dict[STATE_KEY]
        if not isinstance(counters, Mapping) or not counters:
            counters = {}
            log.warning(
                "precision_plugin: scaler checkpoint %r is %r, not a dict of counters; the loss "
                "scale was loaded, the telemetry counters restart at 0",
                STATE_KEY,
                state_dict[STATE_KEY],
            )
        for key, attr in _COUNTERS.items():
            value = counters.get(key)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            if not ok and counters:
                log.warning(
                    "precision_plugin: scaler checkpoint %s[%r] is %s; the loss scale was "
                    "loaded, this counter restarts at 0",
                    STATE_KEY,
                    key,
                    "missing" if key not in counters else f"{value!r}, not a count >= 0",
                )
            setattr(self, attr, int(value) if ok else 0)


#: Telemetry counters in a checkpoint -> the attribute each one restores.
_COUNTERS = {
    "steps": "_pp_steps",
    "skipped_steps": "_pp_skipped",
    "consecutive_skips": "_pp_consecutive",
}
#: torch's own GradScaler state: key -> what a valid value is.
_TORCH_KEYS = {
    "scale": "a finite number > 0",
    "growth_factor": "a finite number > 1",
    "backoff_factor": "a number in (0, 1)",
    "growth_interval": "an integer >= 1",
    "_growth_tracker": "an integer >= 0",
}


def _check_torch_state(state_dict: Mapping[str, Any]) -> None:
    """Refuse a torch scaler state with a missing or damaged key before anything is loaded."""
    for key, allowed in _TORCH_KEYS.items():
        if key not in state_dict:
            raise PrecisionConfigError(
                f"GradScaler.load_state_dict: the checkpoint has no {key!r} (it needs {allowed}); "
                f"nothing was loaded. Load the scaler state saved with this run, or skip loading "
                f"it to start from the policy's init_scale."
            )
        value = state_dict[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        valid = isinstance(value, (int, float)) and not isinstance(value, bool)
        if valid:
            valid = {
                "scale": math.isfinite(value) and value > 0,
                "growth_factor": math.isfinite(value) and value > 1,
                "backoff_factor": 0 < value < 1,
                "growth_interval": float(value).is_integer() and value >= 1,
                "_growth_tracker": float(value).is_integer() and value >= 0,
            }[key]
        if not valid:
            raise PrecisionConfigError(
                f"GradScaler.load_state_dict: checkpoint {key!r} is {state_dict[key]!r}; it must "
                f"be {allowed}. Nothing was loaded."
            )


class TelemetryGradScaler(_Telemetry, torch.amp.GradScaler):
    """``torch.amp.GradScaler`` with [`ScalerStats`][precision_plugin._core.scaler.ScalerStats]
    telemetry
    and the policy's floor."""


class Fp16GradScaler(TelemetryGradScaler):
    """Single-process scaler for fp16 *trainable* parameters (no fp32 master copy).

    torch's ``GradScaler`` refuses fp16 gradients ("Attempting to unscale FP16 gradients");
    ``ShardedGradScaler`` accepts them but needs a process group. This is the same unscale with
    ``allow_fp16=True`` and no collective, for one process.
    """

    def _unscale_grads_(self, optimizer: Any, inv_scale: Any, found_inf: Any, allow_fp16: bool):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


def _sharded_class() -> type:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    global TelemetryShardedGradScaler
    if TelemetryShardedGradScaler is None:
        TelemetryShardedGradScaler = type(
            "TelemetryShardedGradScaler",
            (_Telemetry, ShardedGradScaler),
            {
                "__module__": __name__,
                "__doc__": "``ShardedGradScaler`` with ``ScalerStats`` telemetry.",
            },
        )
    return TelemetryShardedGradScaler


#: Built on first use (importing torch.distributed.fsdp is not free).
TelemetryShardedGradScaler: type | None = None


def _params_are_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return True
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def _trainable_fp16(model: Any) -> bool:
    return any(p.requires_grad and p.dtype == torch.float16 for p in model.parameters())


@checked(device=torch_device)
def make_grad_scaler(
    policy: PrecisionPolicy | Mapping[str, Any] | str | None,
    device: str | torch.device = "cuda",
    *,
    model: torch.nn.Module | None = None,
    sharded: bool | None = None,
) -> torch.amp.GradScaler:
    """Return the dynamic loss scaler for this setup, built with ``policy.loss_scaler``.

    - fp32 master weights: ``TelemetryGradScaler`` (a ``torch.amp.GradScaler``);
    - parameters sharded by FSDP, or fp16 trainable parameters under ``torch.distributed``: a
      ``ShardedGradScaler`` (it all-reduces overflows and accepts fp16 gradients);
    - fp16 trainable parameters in a single process: ``Fp16GradScaler``.

    ``sharded`` forces the choice; by default it is read from ``model`` (FSDP-wrapped modules
    or fp16 trainable parameters). The scaler is disabled (a no-op) unless the policy is fp16
    with ``loss_scaler.enabled``. Every returned scaler reports ``scaler_stats``.
    ``policy`` may be a policy, a dict or a dtype name (``None``: the resolved policy).
    """
    from precision_plugin._core.manager import resolve_policy

    return build_grad_scaler(resolve_policy(policy), device, model=model, sharded=sharded)


def build_grad_scaler(
    policy: PrecisionPolicy,
    device: str | torch.device = "cuda",
    *,
    model: torch.nn.Module | None = None,
    sharded: bool | None = None,
) -> torch.amp.GradScaler:
    """[`make_grad_scaler`][precision_plugin._core.scaler.make_grad_scaler] for a resolved
    ``policy``
    (Accelerate's scaler on CPU)."""
    device_type = torch.device(device).type
    settings = policy.loss_scaler
    kwargs = grad_scaler(settings).to_kwargs()
    kwargs["enabled"] = policy.uses_loss_scaler
    fp16_params = model is not None and _trainable_fp16(model)
    if sharded is None:
        sharded = model is not None and (_params_are_sharded(model) or fp16_params)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if sharded and distributed:
        scaler = _sharded_class()(device_type, **kwargs)
    elif sharded:
        scaler = Fp16GradScaler(device_type, **kwargs)
    else:
        scaler = TelemetryGradScaler(device_type, **kwargs)
    scaler._pp_init(settings)
    return scaler


@checked
def attach_telemetry(scaler: Any, settings: LossScalerSettings) -> bool:
    """Give a scaler someone else built (Accelerate's) the telemetry of
    [`make_grad_scaler`][precision_plugin._core.scaler.make_grad_scaler].

    Works for instances of exactly ``torch.amp.GradScaler`` or ``ShardedGradScaler``: the
    instance's class becomes the telemetry subclass (same state, same behaviour, plus counters),
    so checkpoints, pickling and ``isinstance`` checks keep working. Returns ``False`` (and
    changes nothing) for other scaler types, ``True`` when the scaler reports telemetry now.
    """
    if isinstance(scaler, _Telemetry):
        return True
    target: type | None = None
    if type(scaler) is torch.amp.GradScaler:
        target = TelemetryGradScaler
    else:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        if type(scaler) is ShardedGradScaler:
            target = _sharded_class()
    if target is None:
        log.info(
            "precision_plugin: no loss-scale telemetry for %s (only torch GradScaler and "
            "ShardedGradScaler are observed)",
            type(scaler).__name__,
        )
        return False
    scaler.__class__ = target
    scaler._pp_init(settings)
    return True


@checked
def scaler_stats(scaler: Any) -> ScalerStats | None:
    """[`ScalerStats`][precision_plugin._core.scaler.ScalerStats] of a scaler with telemetry; a bare
    snapshot for a plain torch scaler; ``None`` when ``scaler`` is ``None`` or disabled."""
    if scaler is None or not getattr(scaler, "_enabled", False):
        return None
    if isinstance(scaler, _Telemetry):
        return scaler.precision_stats()
    return ScalerStats(scale=float(scaler.get_scale()))


@checked
def consecutive_skips(scaler: Any) -> int | None:
    """The current run of skipped steps of a scaler with telemetry, read without a device sync;
    ``None`` for any other scaler (or ``None``)."""
    return scaler._pp_consecutive if isinstance(scaler, _Telemetry) else None
