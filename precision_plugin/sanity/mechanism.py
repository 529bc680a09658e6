"""The mechanism readout: how far the train/rollout mismatch turns the policy gradient, per step.

The rollout samples from μ (the inference copy) while plain policy gradient assumes the samples
came from the trainer's π. Weighting each sequence by ``w = π(y)/μ(y) = exp Σ_t (log π − log μ)``
would correct that. Each step this readout compares the gradient the trainer actually took (the
plain policy gradient, TRL's loss with ``num_iterations=1`` and no importance-sampling
correction) with the importance-corrected one, by their cosine: 1 when the mismatch does not
change the update's direction, lower when it does. It costs one extra backward pass through the
graph the trainer already built, so it is off by default and on in the ``long`` preset; it is
attached to the benchmark's own trainer only
([`GradCosineReadout`][precision_plugin.sanity.mechanism.GradCosineReadout]).

Logged per step (TRL's metric lists, averaged at each log):

- ``sanity/grad_cosine``: cos(g_plain, g_corrected), with g_plain read from the parameters'
  ``.grad`` just before the optimizer step (clipping and loss scaling multiply every gradient
  by one number, which a cosine ignores);
- ``sanity/seq_log_ratio_abs``: the mean over sequences of |Σ_t (log π − log μ)|, how far off
  policy a whole sequence is (0.1 means its weight is about 10 % away from 1).
"""

from __future__ import annotations

from typing import Any

#: Log keys of the readout.
COSINE_KEY = "sanity/grad_cosine"
SEQ_RATIO_KEY = "sanity/seq_log_ratio_abs"
#: TRL loss types whose gradient this module reconstructs: per-token sums over the batch
#: (``dapo``, ``bnpo``, ``dr_grpo``: one normalizer per batch) or per-sequence means (``grpo``).
LOSS_TYPES: tuple[str, ...] = ("dapo", "bnpo", "dr_grpo", "grpo")
#: Bound on a sequence log-weight, as TRL bounds its importance ratios.
LOG_WEIGHT_BOUND = 20.0


def corrected_surrogate(
    logps: Any, rollout_logps: Any, advantages: Any, mask: Any, loss_type: str
) -> tuple[Any, Any]:
    """``(surrogate, seq_log_ratio)``: a scalar whose gradient is the importance-corrected policy
    gradient of one batch, and each sequence's Σ_t (log π − log μ).

    ``logps`` are the trainer's per-token log-probs (with their graph), ``rollout_logps`` the
    engine's, ``advantages`` ``[B]`` or ``[B, T]``, ``mask`` ``[B, T]``. The surrogate is TRL's
    loss of that loss type with each sequence's term multiplied by its weight ``w_i`` (detached):
    ``-Σ_i w_i A_i Σ_t m_it log π_it`` over the batch's tokens (``dapo``, ``bnpo``), over
    ``B × T`` (``dr_grpo``), or per sequence over its length, then averaged (``grpo``). Same
    normalizer as the trainer's loss, so a float16 loss scale fits it as it fits the loss.
    """
    import torch

    if loss_type not in LOSS_TYPES:
        from precision_plugin.errors import PrecisionConfigError

        raise PrecisionConfigError(
            f"grad cosine: loss type {loss_type!r} is not one this readout reconstructs; use "
            f"one of {', '.join(LOSS_TYPES)}."
        )
    mask = mask.to(logps.dtype)
    diff = torch.nan_to_num((logps.detach() - rollout_logps) * mask, nan=0.0)
    seq_log_ratio = diff.sum(-1)
    weights = seq_log_ratio.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND).exp()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    per_token = -(weights.unsqueeze(1) * advantages * logps * mask)
    if loss_type == "grpo":
        surrogate = (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "dr_grpo":
        surrogate = per_token.sum() / mask.numel()
    else:
        surrogate = per_token.sum() / mask.sum().clamp(min=1.0)
    return surrogate, seq_log_ratio


def cosine(a: list[Any], b: list[Any]) -> float:
    """Cosine between two gradients given as lists of tensors (in float64); NaN when either is
    zero or not finite."""
    import torch

    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b, strict=True))
    na = sum(float(x.double().pow(2).sum()) for x in a) ** 0.5
    nb = sum(float(y.double().pow(2).sum()) for y in b) ** 0.5
    if not (na > 0 and nb > 0) or not torch.isfinite(torch.tensor([dot, na, nb])).all():
        return float("nan")
    return dot / (na * nb)


class GradCosineReadout:
    """The readout on one ``GRPOTrainer``: ``attach`` it after building the trainer (nothing
    changes on other trainers, or without it).

    Two wrappers on the trainer instance (``precision_plugin._base.patching``, undone by ``detach``)
    keep the policy's
    per-token log-probs with their graph while TRL computes its loss, and add the one extra
    backward; a ``TrainerCallback`` computes the cosine just before each optimizer step.
    """

    def __init__(self) -> None:
        self.trainer: Any = None
        self._patcher: Any = None
        self._capture: dict[str, Any] | None = None
        self._corrected: list[Any] | None = None

    def attach(self, trainer: Any) -> GradCosineReadout:
        """Record the readout on ``trainer`` (its loss type must be one of ``LOSS_TYPES``)."""
        from precision_plugin._base.patching import Patcher
        from precision_plugin.errors import PrecisionConfigError

        if getattr(trainer, "loss_type", None) not in LOSS_TYPES:
            raise PrecisionConfigError(
                f"grad cosine: loss type {getattr(trainer, 'loss_type', None)!r} is not one this "
                f"readout reconstructs; use one of {', '.join(LOSS_TYPES)}."
            )
        self.trainer = trainer
        self._patcher = Patcher("precision_plugin.sanity")
        reason = "the sanity benchmark's gradient-cosine readout, on its own trainer only"
        self._patcher.around(trainer, "_compute_loss", self._compute_loss, reason=reason)
        self._patcher.around(
            trainer, "_get_per_token_logps_and_entropies", self._per_token_logps, reason=reason
        )
        trainer.add_callback(self.callback())
        return self

    def detach(self) -> None:
        """Remove the wrappers (the callback then records nothing)."""
        if self._patcher is not None:
            self._patcher.restore()
        self._patcher, self._corrected = None, None

    def _per_token_logps(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if self._capture is not None and self._capture.get("logps") is None:
            self._capture["logps"] = result[0]  # the policy's forward, graph kept
        return result

    def _compute_loss(self, original: Any, model: Any, inputs: Any) -> Any:
        rollout = inputs.get("sampling_per_token_logps")
        if not self.trainer.model.training or rollout is None:
            return original(model, inputs)
        self._capture = {"logps": None}
        try:
            loss = original(model, inputs)
        finally:
            capture, self._capture = self._capture, None
        if capture["logps"] is not None:
            self._add_corrected_gradient(capture["logps"], rollout, inputs)
        return loss

    def _add_corrected_gradient(self, logps: Any, rollout: Any, inputs: Any) -> None:
        """One extra backward: the importance-corrected gradient of this micro-batch."""
        import torch

        trainer = self.trainer
        mask = inputs["completion_mask"]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]
        surrogate, seq_log_ratio = corrected_surrogate(
            logps, rollout, inputs["advantages"], mask, trainer.loss_type
        )
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None:  # float16: scale as the trainer's backward is scaled
            surrogate = surrogate * scaler.get_scale()
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(surrogate, params, retain_graph=True, allow_unused=True)
        fresh = [
            torch.zeros_like(p) if g is None else g.detach()
            for p, g in zip(params, grads, strict=True)
        ]
        store = self._corrected
        self._corrected = (
            fresh if store is None else [s + g for s, g in zip(store, fresh, strict=True)]
        )
        trainer._metrics["train"][SEQ_RATIO_KEY].append(float(seq_log_ratio.abs().mean()))

    def record_cosine(self) -> None:
        """Before the optimizer step: the cosine of ``.grad`` with the corrected gradient."""
        corrected, self._corrected = self._corrected, None
        if corrected is None:
            return
        import torch

        params = [p for p in self.trainer.model.parameters() if p.requires_grad]
        plain = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        self.trainer._metrics["train"][COSINE_KEY].append(cosine(plain, corrected))

    def callback(self) -> Any:
        """A ``TrainerCallback`` that records the cosine before each optimizer step."""
        from transformers import TrainerCallback

        readout = self

        class _GradCosine(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                readout.record_cosine()

        return _GradCosine()
