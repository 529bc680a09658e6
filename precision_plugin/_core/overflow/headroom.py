"""Headroom analysis: how close each module's activations come to float16's maximum (65504).

Sample inputs run through the model in float32 (no autocast) with a forward hook on every module;
per module the largest ``|activation|`` over all floating outputs is kept, and its margin to
65504 is reported in powers of two. Float32 shows how large a value *would* be, where a float16
forward would already have turned it into ``inf``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from precision_plugin._base.boundary import checked, policy_field
from precision_plugin._base.boundary.typecheck import _show
from precision_plugin._core.overflow.tensors import (
    FP16_MAX,
    abs_max,
    autocast_device_types,
    fp16_margin_bits,
)
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import PrecisionPolicy

#: More flagged modules than this (after removing parents of flagged modules) and the probe
#: recommends consistent bf16 rather than a list of float32 modules.
MAX_FP32_MODULES = 4


@checked
@dataclass(frozen=True)
class ModuleHeadroom:
    """One module: its path (as ``model.named_modules()`` names it; ``""`` is the model itself),
    class, the largest ``|output|`` seen in float32, the margin in powers of two, whether it is
    below the threshold, and the largest ``|input|`` (a module whose inputs are already beyond
    the threshold only carries a large value on, e.g. a later layer on the residual stream)."""

    path: str
    module_class: str
    max_abs: float
    margin_bits: float
    flagged: bool
    max_input_abs: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; a non-finite number becomes ``None`` (JSON has no inf/NaN): a
        ``max_abs`` of ``None`` is a non-finite activation, a ``margin_bits`` of ``None`` with
        a finite ``max_abs`` an all-zero one."""
        out = asdict(self)
        for key in ("max_abs", "margin_bits", "max_input_abs"):
            if not math.isfinite(out[key]):
                out[key] = None
        return out


@checked
@dataclass(frozen=True)
class Recommendation:
    """What to do about the measured headroom.

    ``action`` is ``"none"`` (all clear), ``"keep_fp32_modules"`` (a few modules close to the
    limit; where it starts is in ``modules``), ``"bfloat16"`` (an activation beyond float16's
    range, which a float16 rollout cannot avoid, or too many places), or ``"fix_model"``
    (non-finite even in float32: no precision setting helps).
    """

    action: str
    modules: tuple[str, ...]
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"action": self.action, "modules": list(self.modules), "message": self.message}


@checked
@dataclass
class HeadroomReport:
    """The headroom of every module that produced a floating output, in execution order."""

    modules: list[ModuleHeadroom]
    margin_bits: float
    batches: int
    fp16_max: float = field(default=FP16_MAX)

    @property
    def flagged(self) -> list[ModuleHeadroom]:
        """Modules whose margin is below :attr:`margin_bits` (including non-finite ones)."""
        return [m for m in self.modules if m.flagged]

    @property
    def overflowing(self) -> list[ModuleHeadroom]:
        """Modules whose largest activation does not fit float16 at all (margin below 0)."""
        return [m for m in self.modules if m.margin_bits < 0]

    @property
    def ok(self) -> bool:
        """True when no module is flagged."""
        return not self.flagged

    @property
    def min_margin_bits(self) -> float:
        """The tightest margin over all modules (``inf`` when nothing was measured)."""
        return min((m.margin_bits for m in self.modules), default=math.inf)

    def tightest(self, n: int = 10) -> list[ModuleHeadroom]:
        """The ``n`` modules with the smallest margin, tightest first."""
        return sorted(self.modules, key=lambda m: m.margin_bits)[:n]

    def recommendation(self) -> Recommendation:
        """keep_fp32_modules for a few named modules, consistent bf16 otherwise (see
        :class:`Recommendation`)."""
        return recommend(self)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """JSON-ready dict: threshold, verdict, flagged paths, recommendation and the modules
        (all of them, or the ``top`` tightest)."""
        rows = self.modules if top is None else self.tightest(top)
        tight = self.min_margin_bits
        return {
            "fp16_max": self.fp16_max,
            "margin_bits": self.margin_bits,
            "batches": self.batches,
            "ok": self.ok,
            "min_margin_bits": tight if math.isfinite(tight) else None,
            "flagged": [m.path for m in self.flagged],
            "recommendation": self.recommendation().to_dict(),
            "modules": [m.to_dict() for m in rows],
        }


@checked
def recommend(report: HeadroomReport) -> Recommendation:
    """Turn a report into one :class:`Recommendation`."""
    flagged = report.flagged
    if not flagged:
        return Recommendation(
            "none",
            (),
            f"all clear: every module stays at least 2^{report.margin_bits:g} below float16's "
            f"maximum (tightest margin {report.min_margin_bits:.1f} bits)",
        )
    broken = [m.path or "<model>" for m in flagged if not math.isfinite(m.max_abs)]
    if broken:
        return Recommendation(
            "fix_model",
            tuple(broken),
            f"{broken[0]!r} produces inf/NaN even in float32: the weights or inputs are broken, "
            f"no precision setting fixes that",
        )
    # Where the overflow starts: flagged modules fed by inputs within the margin (the rest carry
    # a large value on), innermost first (a parent is large because its child is).
    threshold = report.margin_bits
    sources = innermost(
        m.path for m in flagged if fp16_margin_bits(m.max_input_abs) >= threshold
    ) or innermost(m.path for m in flagged)
    patterns = ", ".join(repr(p) for p in sources)
    beyond = [m for m in flagged if m.path in sources and m.margin_bits < 0]
    if beyond:
        worst = min(beyond, key=lambda m: m.margin_bits)
        return Recommendation(
            "bfloat16",
            tuple(sources),
            f"{worst.path!r} reaches {worst.max_abs:.3g}, beyond float16's {report.fp16_max:g}: "
            f"a float16 rollout overflows there too, so run consistent bf16 "
            f"(enable(dtype='bfloat16')); overflow.keep_fp32_modules=[{patterns}] fixes the "
            f"learner only (enough when the training data does not come from a float16 rollout)",
        )
    if 0 < len(sources) <= MAX_FP32_MODULES and "" not in sources:
        return Recommendation(
            "keep_fp32_modules",
            tuple(sources),
            f"{len(flagged)} module(s) come within 2^{report.margin_bits:g} of float16's maximum "
            f"but fit; keep where it starts in float32 on the learner with "
            f"overflow.keep_fp32_modules=[{patterns}] (the rollout engine still runs them in "
            f"float16, so their mismatch remains), or run consistent bf16 "
            f"(enable(dtype='bfloat16'))",
        )
    return Recommendation(
        "bfloat16",
        tuple(sources),
        f"{len(sources)} separate places come within 2^{report.margin_bits:g} of float16's "
        f"maximum: too many to keep in float32; run consistent bf16 (enable(dtype='bfloat16'))",
    )


def innermost(paths: Iterable[str]) -> list[str]:
    """The paths that contain no other path of the set: where an overflow starts (a parent's
    output is large because a child's is)."""
    items = list(dict.fromkeys(paths))
    return [
        p for p in items if not any(q != p and (p == "" or q.startswith(p + ".")) for q in items)
    ]


@checked(margin_bits=policy_field("overflow.margin_bits"))
def headroom(
    model: torch.nn.Module,
    batches: torch.Tensor | Mapping[str, Any] | Iterable[torch.Tensor | Mapping[str, Any]],
    *,
    margin_bits: float | None = None,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
) -> HeadroomReport:
    """Measure every module's largest activation in float32 and its margin to float16's maximum.

    ``batches`` is one batch or an iterable of them; a batch is a tensor of input ids (called as
    ``model(ids)``) or a mapping of keyword arguments (``model(**batch)``). ``margin_bits``
    defaults to the policy's ``overflow.margin_bits`` (``policy`` resolved as everywhere else).
    Parameters and buffers in another dtype are cast to float32 for the measurement and cast
    back afterwards (exact for float16/bfloat16); train/eval mode is restored too.
    """
    if margin_bits is None:
        from precision_plugin._core.manager import resolve_policy

        margin_bits = resolve_policy(policy).overflow.margin_bits
    names = {module: name for name, module in model.named_modules()}
    maxima: dict[str, torch.Tensor] = {}
    input_maxima: dict[str, torch.Tensor] = {}
    order: dict[str, str] = {}

    def keep(store: dict[str, torch.Tensor], name: str, value: torch.Tensor) -> None:
        prev = store.get(name)
        store[name] = value if prev is None else torch.maximum(prev, value.to(prev.device))

    def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        value = abs_max(output)
        if value is None:
            return
        name = names[module]
        order.setdefault(name, type(module).__name__)
        keep(maxima, name, value)
        inputs = abs_max((args, kwargs))
        keep(input_maxima, name, inputs if inputs is not None else torch.zeros_like(value))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in names]
    count = 0
    try:
        with _float32(model), torch.no_grad():
            device = _device_of(model)
            for batch in _batches(batches):
                try:
                    _call(model, batch, device)
                except Exception as exc:  # the user's model refused the user's batch
                    raise PrecisionConfigError(
                        f"headroom(): argument 'batches': the model's forward failed on batch "
                        f"{count} ({_show(batch)}) with {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:200]}; pass what the model takes: a "
                        f"tensor of input ids (model(ids)) or a dict of its keyword arguments "
                        f"(model(**batch))."
                    ) from exc
                count += 1
    finally:
        for handle in handles:
            handle.remove()
    if count == 0:
        raise PrecisionConfigError(
            "headroom(): argument 'batches' held no batch, so nothing was measured; pass a "
            "tensor of input ids, a dict of model inputs, or a non-empty list of them."
        )
    values = _to_floats(maxima)
    input_values = _to_floats(input_maxima)
    rows = []
    for name, cls in order.items():
        value = values[name]
        margin = fp16_margin_bits(value)
        flagged = margin < margin_bits
        rows.append(ModuleHeadroom(name, cls, value, margin, flagged, input_values[name]))
    return HeadroomReport(rows, float(margin_bits), count)


def _to_floats(maxima: dict[str, torch.Tensor]) -> dict[str, float]:
    """One device sync for all maxima."""
    if not maxima:
        return {}
    first = next(iter(maxima.values())).device
    stacked = torch.stack([v.to(first) for v in maxima.values()]).tolist()
    return dict(zip(maxima, stacked, strict=True))


def _batches(batches: Any) -> Iterator[Any]:
    if isinstance(batches, (torch.Tensor, Mapping)):
        yield batches
        return
    yield from batches


def _call(model: torch.nn.Module, batch: Any, device: torch.device | None) -> None:
    if isinstance(batch, Mapping):
        model(**{k: _to(v, device) for k, v in batch.items()})
    else:
        model(_to(batch, device))


def _to(value: Any, device: torch.device | None) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) and device is not None else value


def _device_of(model: torch.nn.Module) -> torch.device | None:
    param = next(model.parameters(), None)
    return param.device if param is not None else None


@contextlib.contextmanager
def _float32(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` in float32 with autocast off and eval mode; put dtypes and mode back after."""
    changed: list[tuple[torch.Tensor, torch.dtype]] = []
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            changed.append((tensor, tensor.dtype))
            tensor.data = tensor.data.float()
    was_training = model.training
    model.eval()
    try:
        with contextlib.ExitStack() as stack:
            for device_type in autocast_device_types():
                stack.enter_context(torch.autocast(device_type, enabled=False))
            yield
    finally:
        model.train(was_training)
        for tensor, dtype in changed:
            tensor.data = tensor.data.to(dtype)
