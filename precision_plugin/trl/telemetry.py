"""Train/rollout mismatch during TRL GRPO training, from tensors the trainer already has.

The rollout side is the engine's log-prob of each sampled token, which ``GRPOTrainer`` keeps as
``inputs["sampling_per_token_logps"]`` whenever the engine returned one (vLLM, or a
``rollout_func``'s ``logprobs``), with importance-sampling correction on or off. The trainer
side is what TRL itself treats as π_old: ``inputs["old_per_token_logps"]`` when TRL computed it
(at generation time, with the weights the rollout used), else the per-token log-probs of the
loss computation (TRL skips the old forward exactly when that one is on-policy). No forward is
added: two wrappers read what ``_compute_loss`` receives and what
``_get_per_token_logps_and_entropies`` returns inside it. ``enable()`` installs them on
``GRPOTrainer`` itself; a ``PrecisionCallback`` without ``enable()`` installs them on its own
trainer for the length of ``train()`` (``attach``). The mask is TRL's ``completion_mask``
(times ``tool_mask``). Each rollout slice is counted once even when TRL reuses it
(``num_iterations > 1``); evaluation batches are not counted.

Per process the wrappers add
[`mismatch_sums`][precision_plugin._core.metrics.mismatch.mismatch_sums] and
[`consequence_sums`][precision_plugin._core.metrics.consequence.consequence_sums] (the effective
sample size, the shares TRL's and verl's sequence masks drop, the share of tokens a TIS clip
at 2.0 clips); at a due log every process gathers them, so the figures are token-weighted over
the whole batch and two processes report what one process reports on the same data.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from precision_plugin._base.shield import shielded
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.trl import canary as trl_canary

log = logging.getLogger("precision_plugin")

#: Attribute holding a trainer's accumulator (an attribute of the trainer itself: no module state).
ATTR = "_precision_plugin_mismatch"
#: Attribute holding the patcher of a trainer measured on its own (``attach``).
PATCHER_ATTR = "_precision_plugin_telemetry"
#: What a telemetry failure skips (one warning per process; training goes on).
MEASURING = "the train/rollout mismatch telemetry (precision/* mismatch metrics)"


class MismatchAccumulator:
    """Per-process sums of the mismatch statistics since the last flush."""

    def __init__(self) -> None:
        import torch

        from precision_plugin._core.metrics.consequence import COUNT_FIELDS
        from precision_plugin._core.metrics.mismatch import SUM_FIELDS

        self._torch = torch
        # Created on the first micro-batch's device: no host copy (a device sync) per batch.
        self._size = len(SUM_FIELDS)
        self._counts_size = len(COUNT_FIELDS)
        self.sums: Any = None
        self.maxima: Any = None
        self.counts: Any = None  # consequence counts (add up)
        self.log_moments: Any = None  # [log Σ w, log Σ w²] over sequences (combine by logsumexp)
        self.bitwise: Any = None  # [tokens bit-equal on both sides, tokens] (add up)
        self.capturing = False
        self.captured: Any = None
        self.told_no_rollout_logps = False
        # id -> weak reference: a WeakSet would compare tensors with == on a hash collision.
        self._counted: dict[int, weakref.ref[Any]] = {}

    def counted(self, rollout_logps: Any) -> bool:
        """True when this rollout slice was already counted (TRL reuses it across iterations)."""
        key = id(rollout_logps)
        seen = self._counted.get(key)
        if seen is not None and seen() is rollout_logps:
            return True
        self._counted = {k: r for k, r in self._counted.items() if r() is not None}
        self._counted[key] = weakref.ref(rollout_logps)
        return False

    def add(self, train_logps: Any, rollout_logps: Any, mask: Any) -> None:
        """Add one micro-batch: ``[batch, seq]`` log-probs of both sides and TRL's mask."""
        from precision_plugin._core.metrics.consequence import consequence_sums_of
        from precision_plugin._core.metrics.mismatch import sums_of

        train, rollout = train_logps.detach(), rollout_logps.detach()
        sums, top = sums_of(train, rollout, mask)  # both first: a failure adds nothing
        counts, moments = consequence_sums_of(train, rollout, mask)
        valid = mask.bool()
        # Bit for bit: float32 bit patterns (-0.0 is not 0.0), a NaN equals nothing.
        t32, r32 = train.float(), rollout.float()
        bits = t32.view(self._torch.int32) == r32.view(self._torch.int32)
        same = (bits & valid & ~t32.isnan()).sum()
        bitwise = self._torch.stack([same, valid.sum()]).to(self._torch.float64)
        if self.sums is None:
            self.sums, self.maxima, self.counts, self.log_moments = self._empty(sums.device)
            self.bitwise = self._torch.zeros(2, dtype=self._torch.float64, device=sums.device)
        self.bitwise += bitwise.to(self.bitwise.device)
        self.sums += sums.to(self.sums.device)  # no-op copies: both on the training device
        self.maxima = self._torch.maximum(self.maxima, top.to(self.maxima.device))
        self.counts += counts.to(self.counts.device)
        self.log_moments = self._torch.logaddexp(self.log_moments, moments.to(self.counts.device))

    def _empty(self, device: Any) -> tuple[Any, Any, Any, Any]:
        """Zero sums and counts, a ``-inf`` maximum and ``-inf`` log-moments on ``device``."""
        torch = self._torch
        return (
            torch.zeros(self._size, dtype=torch.float64, device=device),
            torch.full((1,), -torch.inf, dtype=torch.float64, device=device),
            torch.zeros(self._counts_size, dtype=torch.float64, device=device),
            torch.full((2,), -torch.inf, dtype=torch.float64, device=device),
        )

    def flush(self, gather: Callable[[Any], Any] | None = None) -> dict[str, float]:
        """The metrics since the last flush (over every process with ``gather``), and reset.

        ``gather`` concatenates a tensor across processes (``accelerator.gather``); every
        process must call ``flush`` at the same log.
        """
        from precision_plugin._core.metrics.consequence import (
            CONSEQUENCE_METRICS,
            consequence_from_sums,
        )
        from precision_plugin._core.metrics.mismatch import metrics_from_sums

        sums, maxima, counts, moments = self.sums, self.maxima, self.counts, self.log_moments
        bitwise = self.bitwise
        if sums is None:
            sums, maxima, counts, moments = self._empty("cpu")
            bitwise = self._torch.zeros(2, dtype=self._torch.float64)
        if gather is not None:
            # One collective: every process's sums, maximum, counts, log-moments and bit-equal
            # counts in a row.
            row = self._torch.cat([sums, maxima, counts, moments, bitwise])
            rows = gather(row).reshape(-1, row.numel())
            sums, maxima, counts, moments, bitwise = rows.split(
                [sums.numel(), 1, counts.numel(), moments.numel(), 2], dim=1
            )
            sums, counts, bitwise = sums.sum(dim=0), counts.sum(dim=0), bitwise.sum(dim=0)
            maxima = maxima.reshape(-1)
        self.sums, self.maxima, self.counts, self.log_moments = None, None, None, None
        self.bitwise = None
        equal, total = (float(v) for v in bitwise.cpu())
        metrics = metrics_from_sums(sums.cpu(), maxima.cpu())
        consequence = consequence_from_sums(counts.cpu(), moments.cpu())
        return {
            **metrics,
            **{k: getattr(consequence, k) for k in CONSEQUENCE_METRICS},
            "bitwise_equal_frac": equal / total if total else float("nan"),
        }


def accumulator(trainer: Any) -> MismatchAccumulator | None:
    """The trainer's accumulator, or ``None`` when the telemetry never ran on it."""
    return getattr(trainer, ATTR, None)


def flush(trainer: Any) -> dict[str, float]:
    """The mismatch metrics of ``trainer`` since the last flush, over all its processes.

    Empty when the telemetry never ran on this trainer or no token was compared anywhere.
    """
    acc = accumulator(trainer)
    if acc is None:
        return {}
    accelerator = getattr(trainer, "accelerator", None)
    gather = None
    if accelerator is not None and getattr(accelerator, "num_processes", 1) > 1:
        device = accelerator.device

        def gather(t: Any) -> Any:
            return accelerator.gather(t.to(device))

    metrics: dict[str, float] = {}
    with shielded(MEASURING):  # a gather that fails is the metrics' loss, not the run's
        metrics = acc.flush(gather)
    return metrics if metrics.get("tokens", 0) > 0 or metrics.get("nan_tokens", 0) > 0 else {}


#: Said once per trainer when TRL hands the loss no rollout log-probs, so nothing is measured.
NO_ROLLOUT_LOGPS = (
    "precision_plugin: no precision/* mismatch metric in this run: its rollouts carry no "
    "log-probs (TRL's own generation, use_vllm=False without a rollout_func, keeps none). "
    "Fix: GRPOTrainer(..., rollout_func=precision_plugin.trl.HFRollout()) or use_vllm=True "
    "measures the train/rollout mismatch; metrics.enabled=False silences this."
)


def _mask(inputs: Any) -> Any:
    mask = inputs["completion_mask"]
    tool = inputs.get("tool_mask")
    return mask if tool is None else mask * tool


def compute_loss(
    policy: PrecisionPolicy, original: Callable[..., Any], self: Any, model: Any, inputs: Any
) -> Any:
    """Advice around ``GRPOTrainer._compute_loss``: measure the mismatch of each new rollout
    slice while the loss is computed (training only, while ``policy.metrics.enabled``)."""
    if not policy.metrics.enabled or not getattr(self.model, "training", False):
        return original(self, model, inputs)
    acc = accumulator(self)
    if acc is None:
        acc = MismatchAccumulator()
        setattr(self, ATTR, acc)
    rollout = inputs.get("sampling_per_token_logps")
    if rollout is None and not acc.told_no_rollout_logps:
        acc.told_no_rollout_logps = True
        log.warning(NO_ROLLOUT_LOGPS)
    if rollout is None or acc.counted(rollout):
        return original(self, model, inputs)
    canary = trl_canary.state_of(self, policy)  # the canary set: the first rollout batch
    if canary is not None:
        with shielded("the drift canary's set (precision/canary_*)", policy.strictness):
            canary.remember(inputs)
    old = inputs.get("old_per_token_logps")
    if old is not None:
        result = original(self, model, inputs)
        with shielded(MEASURING, policy.strictness):  # the loss step is not ours to stop
            acc.add(old, rollout, _mask(inputs))
        return result
    acc.capturing, acc.captured = True, None
    try:
        result = original(self, model, inputs)
    finally:
        captured, acc.capturing, acc.captured = acc.captured, False, None
    if captured is not None:
        with shielded(MEASURING, policy.strictness):
            acc.add(captured, rollout, _mask(inputs))
    return result


def per_token_logps(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """Advice around ``GRPOTrainer._get_per_token_logps_and_entropies``: inside
    ``_compute_loss``, keep the policy's per-token log-probs (its first call there)."""
    result = original(self, *args, **kwargs)
    acc = accumulator(self)
    if acc is not None and acc.capturing and acc.captured is None:
        with shielded(MEASURING):
            acc.captured = result[0].detach()
    return result


def attach(trainer: Any, policy: PrecisionPolicy) -> bool:
    """Measure the mismatch on ``trainer`` alone, until ``detach(trainer)``.

    For a ``PrecisionCallback`` used without ``enable()``: the same two wrappers, installed on
    this trainer instance instead of on ``GRPOTrainer``. Returns ``False`` (and does nothing)
    when ``trainer`` is not a GRPO trainer, or when ``enable()`` already measures every one.
    """
    from precision_plugin._base.patching import Patcher, is_patched

    cls = type(trainer)
    compute = getattr(cls, "_compute_loss", None)
    logps = getattr(cls, "_get_per_token_logps_and_entropies", None)
    if compute is None or logps is None or is_patched(compute) or PATCHER_ATTR in vars(trainer):
        return False

    def on_instance(advice: Callable[..., Any]) -> Callable[..., Any]:
        # The wrappers take the class's calling convention (original, self, *args).
        def instance_advice(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return advice(lambda _self, *a, **k: original(*a, **k), trainer, *args, **kwargs)

        return instance_advice

    reason = "PrecisionCallback without enable(): the mismatch of this trainer only"
    patcher = Patcher("precision_plugin.PrecisionCallback", tracked=True)
    advice = on_instance(partial(compute_loss, policy))
    patcher.around(trainer, "_compute_loss", advice, reason=reason)
    patcher.around(
        trainer, "_get_per_token_logps_and_entropies", on_instance(per_token_logps), reason=reason
    )
    patcher.setattr(trainer, PATCHER_ATTR, patcher, reason=reason)
    return True


def detach(trainer: Any) -> None:
    """Remove what [`attach`][precision_plugin.trl.telemetry.attach] installed on ``trainer``
    (the accumulator stays, so metrics not yet logged can still be flushed)."""
    patcher = vars(trainer).get(PATCHER_ATTR) if trainer is not None else None
    if patcher is not None:
        patcher.restore()
