"""Runtime overflow detection: on a checked step, name the first module whose forward output is
inf/NaN.

Cheap by construction: forward hooks exist only during checked steps (every ``every``-th step
under ``mode="sampled"``, every step under ``"always"``, or one step after
:meth:`OverflowDetector.check_next_step`). A checked step costs one ``|x|.amax()`` per module
output and one device sync when the top-level forward returns; other steps cost nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from precision_plugin._base.boundary import checked, policy_field
from precision_plugin._base.patching import track, untrack
from precision_plugin._base.shield import shielded
from precision_plugin._core.overflow.tensors import FP16_MAX, abs_max, floating_tensors
from precision_plugin.errors import ForwardOverflowError
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

MODES = ("off", "sampled", "always")


@checked
@dataclass(frozen=True)
class OverflowEvent:
    """The first module of a forward whose output was non-finite.

    ``input_max`` is the largest ``|input|`` of that module (``inf``/``nan`` when its inputs were
    already non-finite: then an operation between modules, in the parent's forward, produced it).
    """

    step: int
    module: str
    module_class: str
    kind: str
    output_dtype: str
    input_max: float

    @property
    def inputs_finite(self) -> bool:
        """True when the module got finite inputs, i.e. it produced the inf/NaN itself."""
        return math.isfinite(self.input_max)

    def message(self) -> str:
        """The one-paragraph report: where, what, and the two fixes."""
        where = self.module or "<model>"
        if self.inputs_finite:
            cause = (
                f"from inputs of at most {self.input_max:.4g} in magnitude (float16 ends at "
                f"{FP16_MAX:g})"
            )
        else:
            cause = (
                "but its inputs were already non-finite: an operation between modules (in the "
                "parent's forward) produced them"
            )
        return (
            f"precision_plugin: forward overflow at step {self.step}: module {where!r} "
            f"({self.module_class}) is the first to output {self.kind} in {self.output_dtype}, "
            f"{cause}. Fix: run consistent bf16 (enable(dtype='bfloat16')), or keep it in float32 "
            f"on the learner with overflow.keep_fp32_modules=[{where!r}] (a float16 rollout "
            f"engine still runs it in float16). `precision-plugin probe --model PATH` measures "
            f"the headroom of every module"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@checked(
    mode=policy_field("overflow.detect"),
    every=policy_field("overflow.detect_every"),
    strictness=policy_field("strictness"),
)
class OverflowDetector:
    """Forward-overflow detection for one model, step by step.

    Call :meth:`begin_step` before and :meth:`end_step` after each optimizer step (or use
    :meth:`step` as a context manager). On a checked step every module gets a forward hook; when
    the top-level forward returns, the first module (in execution order) whose output holds
    inf/NaN is reported: :class:`~precision_plugin.errors.ForwardOverflowError` under
    ``strictness="error"``, a warning otherwise (once per step). Reports are kept in
    :attr:`events`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        mode: str = "sampled",
        every: int = 10,
        strictness: str = "warn",
    ) -> None:
        self.model = model
        self.mode = mode
        self.every = every
        self.strictness = strictness
        #: Every reported overflow, oldest first.
        self.events: list[OverflowEvent] = []
        #: The last step that was checked, and what it found (``None``: the forward was finite).
        self.last_checked: tuple[int, OverflowEvent | None] | None = None
        self._armed_once = False
        self._handles: list[Any] = []
        self._pending: list[tuple[str, torch.nn.Module, torch.Tensor, str, Any]] = []
        self._step = 0
        self._found: OverflowEvent | None = None

    @classmethod
    def from_policy(
        cls,
        model: torch.nn.Module,
        policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    ) -> OverflowDetector:
        """A detector set up from ``policy.overflow`` and ``policy.strictness``."""
        from precision_plugin._core.manager import resolve_policy

        return detector_for(model, resolve_policy(policy), cls)

    @property
    def active(self) -> bool:
        """True while hooks are installed (a checked step is running)."""
        return bool(self._handles)

    def due(self, step: int) -> bool:
        """Whether ``step`` is checked (an armed one-off check counts too)."""
        if self._armed_once or self.mode == "always":
            return True
        return self.mode == "sampled" and step % self.every == 0

    def check_next_step(self) -> None:
        """Check the next step whatever the mode (used to diagnose repeated loss-scaler skips)."""
        self._armed_once = True

    def begin_step(self, step: int) -> bool:
        """Install the hooks when ``step`` is due; return whether it is checked."""
        self._remove_hooks()
        self._step = step
        self._found = None
        self._pending.clear()
        if not self.due(step):
            return False
        self._armed_once = False
        names = {module: name for name, module in self.model.named_modules()}
        track(self.close, f"OverflowDetector: forward hooks on {type(self.model).__name__}")
        for module, name in names.items():
            self._handles.append(
                module.register_forward_hook(self._make_hook(name), with_kwargs=True)
            )
        return True

    def end_step(self) -> OverflowEvent | None:
        """Remove the hooks; return the step's overflow (``None`` when finite or not checked)."""
        was_checked = self.active
        try:
            self._evaluate()
        finally:
            self._remove_hooks()
            self._pending.clear()
        if was_checked:
            self.last_checked = (self._step, self._found)
        return self._found if was_checked else None

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[bool]:
        """``with detector.step(n) as checked:`` around one optimizer step."""
        checked = self.begin_step(step)
        try:
            yield checked
        except BaseException:
            self.close()  # the step failed already: do not add a second error
            raise
        self.end_step()

    def close(self) -> None:
        """Remove any hooks left (safe to call twice)."""
        self._remove_hooks()
        self._pending.clear()

    # -- internals -----------------------------------------------------------------------------
    def _make_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if self._found is not None:
                return
            # Inside the user's forward: only strictness="error" may stop it.
            with shielded("forward-overflow detection", self.strictness):
                value = abs_max(output)
                if value is not None:
                    dtype = first_floating_dtype(output) or "?"
                    self._pending.append((name, module, value, dtype, (args, kwargs)))
                if module is self.model:  # the top-level forward returned: one sync for all
                    self._evaluate()

        return hook

    def _evaluate(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or self._found is not None:
            return
        device = pending[0][2].device
        finite = torch.isfinite(torch.stack([p[2].to(device) for p in pending])).tolist()
        first = next((i for i, ok in enumerate(finite) if not ok), None)
        if first is None:
            return
        name, module, value, output_dtype, inputs = pending[first]
        in_max = abs_max(inputs)
        event = OverflowEvent(
            step=self._step,
            module=name,
            module_class=type(module).__name__,
            kind="nan" if math.isnan(float(value)) else "inf",
            output_dtype=output_dtype,
            input_max=float(in_max) if in_max is not None else 0.0,
        )
        self._found = event
        self.events.append(event)
        if self.strictness == "error":
            self._remove_hooks()
            raise ForwardOverflowError(
                event.message() + " (strictness='error').",
                module=event.module,
                module_class=event.module_class,
                step=event.step,
                input_max=event.input_max,
                kind=event.kind,
            )
        log.warning("%s.", event.message())

    def _remove_hooks(self) -> None:
        untrack(self.close)
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


@checked
def first_floating_dtype(value: Any) -> str | None:
    """The dtype name of the first floating tensor in ``value`` (``None`` when there is none)."""
    tensor = next(floating_tensors(value), None)
    return None if tensor is None else str(tensor.dtype).removeprefix("torch.")


def detector_for(
    model: torch.nn.Module, policy: PrecisionPolicy, cls: type[OverflowDetector] | None = None
) -> OverflowDetector:
    """[`OverflowDetector.from_policy`][precision_plugin._core.overflow.OverflowDetector.from_policy]
    for a resolved ``policy`` (the callback's detector); ``cls`` a subclass to build."""
    settings = policy.overflow
    return (cls or OverflowDetector)(
        model,
        mode=settings.detect,
        every=settings.detect_every,
        strictness=policy.strictness,
    )
