"""``precision-plugin probe --layerwise``: where in the network the rollout and the trainer part.

The longest sampled sequence of each dtype is replayed (one full forward, prompt and
completion) through both sides with hooks on the model's stages, in forward order: the
embedding, the rotary embedding (when the family has one), each decoder layer, the final norm.
The trainer side is the fp32 model under ``torch.autocast(dtype)``; the rollout side is the
rollout engine's copy of the weights in ``dtype`` (buffers as the engine keeps them).

Per stage, in units of the dtype's unit roundoff ``u`` (2^-11 float16, 2^-8 bfloat16):

- ``units``: the relative error ``‖h_rollout − h_trainer‖ / ‖h_trainer‖`` of the stage's
  output when each side runs on its own (what the logits finally see);
- ``local_units``: the same when the rollout side's stage gets the trainer side's input (the
  error that stage itself adds; the teacher-forced replay);
- ``saturated`` / ``near_limit`` (float16 only): output elements that are not finite or reach
  float16's 65504, and those within ``2**margin_bits`` of it.

The sides **part** at the first stage whose local error exceeds ``PART_FACTOR`` times the
median stage's (and one rounding unit): a stage that adds far more error than the others is a
source (a layer run in another dtype, RoPE frequencies rounded on one side, an overflow).
Inside the first parting decoder layer (else the layer with the largest local error) each
module is replayed the same way, teacher-forced at every module, to name the operation.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from precision_plugin._base.boundary import (
    checked,
    dtype_name,
    policy_field,
    torch_device,
    torch_module,
)
from precision_plugin._core.rollout import RolloutSample
from precision_plugin.probe.scoring import trainer_precision

log = logging.getLogger("precision_plugin")

#: Unit roundoff ``u = 2^-p`` (p: significand bits with the implicit one).
UNIT_ROUNDOFF: dict[str, float] = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
#: A stage parts from the rest when its local error is this many times the median stage's.
PART_FACTOR = 4.0
#: float16's largest finite value.
FLOAT16_MAX = 65504.0


@checked
@dataclass(frozen=True)
class StageDivergence:
    """One stage (or one module of the breakdown layer) and how far the two sides differ there."""

    name: str
    module_class: str
    units: float
    local_units: float
    saturated: int | None = None
    near_limit: int | None = None


@checked
@dataclass
class DtypeLayerwise:
    """The layerwise replay of one dtype."""

    dtype: str
    unit_roundoff: float
    tokens: int
    stages: list[StageDivergence]
    parted_at: str | None
    breakdown_layer: str | None
    modules: list[StageDivergence] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def median_local_units(self) -> float:
        """The median stage's local error: the rounding baseline a parting stage stands above."""
        values = [s.local_units for s in self.stages if math.isfinite(s.local_units)]
        return statistics.median(values) if values else math.nan

    @property
    def line(self) -> str:
        """One sentence: where the sides part, the module inside, the float16 saturation."""
        base = f"median stage {self.median_local_units:.2g} u"
        if self.parted_at is None:
            worst = max(self.stages, key=lambda s: s.local_units, default=None)
            text = f"{self.dtype}: no stage stands out ({base}); the divergence is rounding"
            if worst is not None:
                text += f", largest local error {worst.local_units:.2g} u at {worst.name}"
        else:
            stage = next(s for s in self.stages if s.name == self.parted_at)
            text = (
                f"{self.dtype}: the sides part at {stage.name} ({stage.module_class}): "
                f"{stage.local_units:.3g} u of local error against a {base}"
            )
        if self.modules:
            top = max(self.modules, key=lambda m: m.local_units)
            text += (
                f"; inside {self.breakdown_layer}: {top.name} adds most ({top.local_units:.3g} u)"
            )
        if self.dtype == "float16":
            saturated = sum(s.saturated or 0 for s in self.stages)
            near = sum(s.near_limit or 0 for s in self.stages)
            text += f"; float16 saturation: {saturated} values at the limit, {near} near it"
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "unit_roundoff": self.unit_roundoff,
            "tokens": self.tokens,
            "stages": [asdict(s) for s in self.stages],
            "median_local_units": self.median_local_units,
            "parted_at": self.parted_at,
            "breakdown_layer": self.breakdown_layer,
            "modules": [asdict(m) for m in self.modules],
            "line": self.line,
            "seconds": round(self.seconds, 3),
        }


@checked
@dataclass
class LayerwiseReport:
    """The probe's ``layerwise`` section, a ``DtypeLayerwise`` per low-precision dtype."""

    dtypes: dict[str, DtypeLayerwise] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "replayed": "the longest sampled sequence per dtype, one full forward per side",
            "part_factor": PART_FACTOR,
            "dtypes": {name: d.to_dict() for name, d in self.dtypes.items()},
            "seconds": round(self.seconds, 3),
        }


# -- the model's stages -------------------------------------------------------------------------


def stages_of(model: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of the stages: the base model's children, its layer list expanded.

    Names are as ``model.named_modules()`` gives them; the order is the children's, and the
    replay records the order in which they actually run.
    """
    import torch

    base = getattr(model, "base_model", model)
    prefix = next((n for n, m in model.named_modules() if m is base), "")
    out = []
    for name, child in base.named_children():
        full = f"{prefix}.{name}" if prefix else name
        if isinstance(child, torch.nn.ModuleList):
            out.extend((f"{full}.{i}", layer) for i, layer in enumerate(child))
        elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            out.append((full, child))
    return out


def _floats(value: Any) -> Iterator[Any]:
    """The floating-point tensors in ``value`` (a tensor, or tuples/lists of them)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _floats(item)


def _replace(own: Any, given: Any) -> Any:
    """``own`` with each floating tensor replaced by ``given``'s, in ``own``'s dtype."""
    import torch

    if isinstance(own, torch.Tensor) and isinstance(given, torch.Tensor):
        if own.is_floating_point() and given.shape == own.shape:
            return given.to(dtype=own.dtype, device=own.device)
        return own
    sequences = (tuple, list)
    if isinstance(own, sequences) and isinstance(given, sequences) and len(own) == len(given):
        return type(own)(_replace(a, b) for a, b in zip(own, given, strict=True))
    return own


def _forced_kwargs(own: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    # Masks stay the side's own: an additive mask's minimum differs per dtype on purpose.
    return {
        k: v if "mask" in k or k not in given else _replace(v, given[k]) for k, v in own.items()
    }


class _Errors:
    """Running ``Σ‖r − t‖²`` and ``Σ‖t‖²`` of a stage's outputs (float64)."""

    def __init__(self) -> None:
        self.diff = 0.0
        self.norm = 0.0

    def add(self, rollout: Any, trainer: Any) -> None:
        for r, t in zip(_floats(rollout), _floats(trainer), strict=False):
            r64, t64 = r.double(), t.double()
            self.diff += float(((r64 - t64) ** 2).sum())
            self.norm += float((t64**2).sum())

    def relative(self) -> float:
        if self.norm <= 0.0:
            return 0.0 if self.diff == 0.0 else math.inf
        return math.sqrt(self.diff / self.norm)


class _Saturation:
    def __init__(self, near: float) -> None:
        self.near = near
        self.saturated = 0
        self.near_limit = 0

    def add(self, output: Any) -> None:
        for t in _floats(output):
            a = t.detach().abs()
            self.saturated += int((~(a < FLOAT16_MAX)).sum())  # inf, NaN and the limit itself
            self.near_limit += int(((a >= self.near) & (a < FLOAT16_MAX)).sum())


def _run_hooked(run: Callable[[], None], handles: list[Any]) -> None:
    """``run()``, then remove the hooks whatever happens."""
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()


def _record(
    modules: Sequence[tuple[str, Any]], run: Callable[[], None]
) -> tuple[dict[str, tuple[Any, Any]], dict[str, Any], list[str]]:
    """Run ``run`` with hooks keeping each module's (first call's) inputs and outputs; returns
    ``(inputs, outputs, order)``."""
    inputs: dict[str, tuple[Any, Any]] = {}
    outputs: dict[str, Any] = {}
    order: list[str] = []
    handles = []
    for name, module in modules:

        def pre(_m: Any, args: Any, kwargs: Any, name: str = name) -> None:
            if name not in inputs:
                inputs[name] = (args, dict(kwargs))

        def post(_m: Any, _args: Any, _kwargs: Any, output: Any, name: str = name) -> None:
            if name not in outputs:
                outputs[name] = output
                order.append(name)

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    _run_hooked(run, handles)
    return inputs, outputs, order


def _compare(
    modules: Sequence[tuple[str, Any]],
    run: Callable[[], None],
    trainer_outputs: dict[str, Any],
    trainer_inputs: dict[str, tuple[Any, Any]] | None,
    near: float | None,
) -> tuple[dict[str, float], dict[str, _Saturation]]:
    """Run ``run`` (the rollout side) comparing each module's output with the trainer's; with
    ``trainer_inputs`` every module first gets the trainer's input (teacher forcing)."""
    errors = {name: _Errors() for name, _ in modules}
    saturation = {name: _Saturation(near) for name, _ in modules} if near else {}
    seen: set[str] = set()
    handles = []
    for name, module in modules:
        if trainer_inputs is not None and name in trainer_inputs:

            def pre(_m: Any, args: Any, kwargs: Any, name: str = name) -> Any:
                if name in seen:
                    return None
                given_args, given_kwargs = trainer_inputs[name]
                return _replace(args, given_args), _forced_kwargs(kwargs, given_kwargs)

            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))

        def post(_m: Any, _args: Any, _kwargs: Any, output: Any, name: str = name) -> None:
            if name in seen or name not in trainer_outputs:
                return
            seen.add(name)
            errors[name].add(output, trainer_outputs[name])
            if near:
                saturation[name].add(output)

        handles.append(module.register_forward_hook(post, with_kwargs=True))
    _run_hooked(run, handles)
    return {n: e.relative() for n, e in errors.items() if n in seen}, saturation


def _forward(model: Any, sample: RolloutSample, device: str) -> Callable[[], None]:
    import torch

    ids = torch.tensor([list(sample.prompt_ids) + list(sample.completion_ids)], device=device)
    mask = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1], device=device)[None]

    def run() -> None:
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)

    return run


def outliers(stages: Sequence[StageDivergence]) -> list[str]:
    """The stages whose local error exceeds ``PART_FACTOR`` times the median stage's and one
    rounding unit, in forward order (a non-finite error counts as one)."""
    values = [s.local_units for s in stages if math.isfinite(s.local_units)]
    if not values:
        return []
    bar = max(PART_FACTOR * statistics.median(values), 1.0)
    return [s.name for s in stages if not s.local_units <= bar]


@checked(
    trainer_model=torch_module,
    rollout_model=torch_module,
    dtype=dtype_name,
    device=torch_device,
    margin_bits=policy_field("overflow.margin_bits"),
)
def replay(
    trainer_model: Any,
    rollout_model: Any,
    sample: RolloutSample,
    dtype: str,
    device: str,
    *,
    margin_bits: float = 3.0,
) -> DtypeLayerwise:
    """Replay ``sample`` through ``trainer_model`` (fp32 weights, autocast to ``dtype``) and
    ``rollout_model`` (the rollout engine's ``dtype`` copy) and report where they part."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"layerwise replay: unknown dtype {dtype!r}")
    started = time.perf_counter()
    u = UNIT_ROUNDOFF[dtype]
    near = FLOAT16_MAX / 2.0**margin_bits if dtype == "float16" else None
    trainer_stages = stages_of(trainer_model)
    rollout_stages = stages_of(rollout_model)
    train_run = _forward(trainer_model, sample, device)
    roll_run = _forward(rollout_model, sample, device)

    def trainer_side() -> None:
        with trainer_precision(dtype, device):
            train_run()

    inputs, outputs, order = _record(trainer_stages, trainer_side)
    free, saturation = _compare(rollout_stages, roll_run, outputs, None, near)
    local, _ = _compare(rollout_stages, roll_run, outputs, inputs, None)
    classes = {name: type(m).__name__ for name, m in trainer_stages}
    stages = [
        StageDivergence(
            name,
            classes[name],
            free.get(name, math.nan) / u,
            local.get(name, math.nan) / u,
            saturation[name].saturated if name in saturation else None,
            saturation[name].near_limit if name in saturation else None,
        )
        for name in order
    ]
    del inputs, outputs
    apart = outliers(stages)
    layers = [s for s in stages if _is_layer(s.name)]
    target = next((name for name in apart if _is_layer(name)), None)
    if target is None and layers:
        target = max(layers, key=lambda s: s.local_units).name
    modules = []
    if target is not None:
        modules = _breakdown(trainer_model, rollout_model, target, trainer_side, roll_run, u, near)
    return DtypeLayerwise(
        dtype=dtype,
        unit_roundoff=u,
        tokens=len(sample.prompt_ids) + len(sample.completion_ids),
        stages=stages,
        parted_at=apart[0] if apart else None,
        breakdown_layer=target,
        modules=modules,
        seconds=time.perf_counter() - started,
    )


def _is_layer(name: str) -> bool:
    return name.rsplit(".", 1)[-1].isdigit()


def _breakdown(
    trainer_model: Any,
    rollout_model: Any,
    layer: str,
    trainer_side: Callable[[], None],
    roll_run: Callable[[], None],
    u: float,
    near: float | None,
) -> list[StageDivergence]:
    """Each module inside ``layer``, teacher-forced at every module."""
    trainer_layer = dict(trainer_model.named_modules())[layer]
    rollout_layer = dict(rollout_model.named_modules())[layer]
    t_mods = [(f"{layer}.{n}", m) for n, m in trainer_layer.named_modules() if n]
    r_mods = [(f"{layer}.{n}", m) for n, m in rollout_layer.named_modules() if n]
    inputs, outputs, order = _record(t_mods, trainer_side)
    local, saturation = _compare(r_mods, roll_run, outputs, inputs, near)
    classes = {name: type(m).__name__ for name, m in t_mods}
    return [
        StageDivergence(
            name,
            classes[name],
            math.nan,
            local.get(name, math.nan) / u,
            saturation[name].saturated if name in saturation else None,
            saturation[name].near_limit if name in saturation else None,
        )
        for name in order
    ]


def longest(samples: Sequence[RolloutSample]) -> RolloutSample | None:
    """The sample with the most completion tokens (the first of equals), or ``None``."""
    best = None
    for s in samples:
        if s.completion_ids and (best is None or len(s.completion_ids) > len(best.completion_ids)):
            best = s
    return best
