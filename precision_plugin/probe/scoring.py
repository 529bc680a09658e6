"""Trainer-side scoring: the sampled tokens scored the way a trainer does (fp32 master weights,
one full-sequence forward under autocast), and the mismatch against the rollout's log-probs."""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from precision_plugin.boundary import at_least, checked, dtype_name, torch_device, torch_module
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.mismatch import MismatchMetrics, compute_mismatch
from precision_plugin.policy import MetricSettings
from precision_plugin.probe.engine import RolloutSample
from precision_plugin.probe.schema import SelfCheck

log = logging.getLogger("precision_plugin")


@checked(dtype=dtype_name, device=torch_device)
@contextlib.contextmanager
def trainer_precision(dtype: str, device: str) -> Iterator[None]:
    """Autocast to ``dtype`` as a mixed-precision trainer does (nothing for float32)."""
    import torch

    if dtype == "float32":
        yield
        return
    with torch.autocast(device_type=device.split(":", 1)[0], dtype=getattr(torch, dtype)):
        yield


#: Logits computed at once on the trainer path: positions per chunk = this // vocabulary size
#: (16 Mi logits, 64 MiB in float32), so memory does not grow with the sequence length.
CHUNK_LOGITS = 1 << 24


@checked(
    model=torch_module,
    dtype=dtype_name,
    device=torch_device,
    batch_size=at_least(1),
    chunk_logits=at_least(1),
)
def trainer_logprobs(
    model: Any,
    samples: Sequence[RolloutSample],
    dtype: str,
    device: str,
    *,
    batch_size: int = 1,
    chunk_logits: int = CHUNK_LOGITS,
) -> list[list[float]]:
    """Score each sample's completion with a full-sequence forward, as a trainer does.

    One forward per ``batch_size`` sequences (default one: no padding at all). A batch is LEFT
    padded, with an attention mask that hides the pads and position ids counted from each row's
    first real token, so every row sees exactly what it sees alone: ``0..T-1`` and all its own
    tokens. The model runs once for the hidden states; the LM head, the family's logit transform
    (scaling, final soft-capping) and a float32 ``log_softmax`` then run on a few positions at a
    time (:func:`chunked_token_logprobs`), so no ``[T, vocab]`` tensor is ever built.
    """
    head = lm_head_of(model)
    out: list[list[float]] = [[] for _ in samples]
    todo = [i for i, s in enumerate(samples) if s.completion_ids]
    for first in range(0, len(todo), batch_size):
        rows = todo[first : first + batch_size]
        for i, logp in zip(
            rows,
            _score_batch(model, head, [samples[i] for i in rows], dtype, device, chunk_logits),
            strict=True,
        ):
            out[i] = logp
    return out


def _score_batch(
    model: Any,
    head: LMHead,
    batch: Sequence[RolloutSample],
    dtype: str,
    device: str,
    chunk_logits: int,
) -> list[list[float]]:
    import torch

    seqs = [list(s.prompt_ids) + list(s.completion_ids) for s in batch]
    width = max(len(seq) for seq in seqs)
    pad = _pad_id(model)
    ids = torch.tensor([[pad] * (width - len(seq)) + seq for seq in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(seq)) + [1] * len(seq) for seq in seqs], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    # Row b's completion fills its last n_b columns; its tokens are predicted one column earlier.
    rows = torch.cat([torch.full((len(s.completion_ids),), b) for b, s in enumerate(batch)])
    cols = torch.cat(
        [torch.arange(width - len(s.completion_ids) - 1, width - 1) for s in batch]
    ).to(device)
    targets = ids[rows.to(device), cols + 1]
    with torch.inference_mode(), trainer_precision(dtype, device):
        hidden = head.hidden_states(model, ids, mask, positions)
        logp = head.token_logprobs(hidden[rows.to(device), cols], targets, chunk_logits)
    flat = logp.tolist()
    out, at = [], 0
    for s in batch:
        out.append(flat[at : at + len(s.completion_ids)])
        at += len(s.completion_ids)
    return out


def _pad_id(model: Any) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0


class LMHead:
    """A causal LM's output head, split from its body so logits can be computed in chunks.

    ``hidden_states`` runs the whole model once but lets its LM head see only the last position
    (a forward pre-hook records the head's input and hands the head one row), so the model's own
    code (masks, rotary positions, final norm, any family quirk) produces the hidden states.
    ``token_logprobs`` applies the head and the family's logit transform (Cohere's
    ``logit_scale``, Granite's ``logits_scaling``, Gemma 2/3's ``final_logit_softcapping``) in
    the same order as the family's ``ForCausalLM.forward``. :func:`lm_head_of` checks this
    against the model's own logits once per model; where it differs (an unknown transform),
    ``chunked`` is False and the full logits are used, still log-softmaxed in chunks.
    """

    def __init__(self, model: Any) -> None:
        self.module = model.get_output_embeddings()
        config = getattr(model.config, "get_text_config", lambda: model.config)()
        scale = getattr(model, "logit_scale", None)  # Cohere keeps it on the model
        self.scale = float(scale) if isinstance(scale, (int, float)) else None
        divide = getattr(config, "logits_scaling", None)
        self.divide = float(divide) if isinstance(divide, (int, float)) and divide != 1 else None
        cap = getattr(config, "final_logit_softcapping", None)
        self.softcap = float(cap) if isinstance(cap, (int, float)) and cap > 0 else None
        self.chunked = self.module is not None

    def hidden_states(self, model: Any, ids: Any, mask: Any, positions: Any) -> Any:
        """``[batch, T, hidden]``: the LM head's input at every position (or the full logits
        when ``chunked`` is False)."""
        if not self.chunked:
            return model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits
        seen: list[Any] = []

        def keep_last(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            if not args:
                return None
            seen.append(args[0])
            return (args[0][:, -1:], *args[1:])

        handle = self.module.register_forward_pre_hook(keep_last)
        try:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        finally:
            handle.remove()
        if len(seen) != 1:
            raise RuntimeError(f"the LM head ran {len(seen)} times in one forward, not once")
        return seen[0]

    def logits(self, hidden: Any) -> Any:
        """The family's logits of ``hidden`` (``[..., hidden] -> [..., vocab]``)."""
        import torch

        if not self.chunked:
            return hidden
        logits = self.module(hidden)
        if self.scale is not None:
            logits = logits * self.scale
        if self.divide is not None:
            logits = logits / self.divide
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def token_logprobs(self, hidden: Any, targets: Any, chunk_logits: int) -> Any:
        """``log_softmax`` (float32) of each row's logits at its target token, chunk by chunk."""
        import torch

        vocab = self.module.out_features if self.chunked else hidden.shape[-1]
        step = max(1, chunk_logits // max(1, int(vocab)))
        parts = []
        for at in range(0, hidden.shape[0], step):
            logits = self.logits(hidden[at : at + step]).float()
            logp = torch.log_softmax(logits, dim=-1)
            parts.append(logp.gather(-1, targets[at : at + step, None]).squeeze(-1))
            del logits, logp
        return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


_HEADS: weakref.WeakKeyDictionary[Any, LMHead] = weakref.WeakKeyDictionary()


def lm_head_of(model: Any) -> LMHead:
    """The model's :class:`LMHead`, checked once against the model's own float32 logits."""
    head = _HEADS.get(model)
    if head is None:
        head = LMHead(model)
        if head.chunked and not _agrees(model, head):
            log.info(
                "probe: %s's logits are not lm_head(hidden) with a known transform; the trainer "
                "path uses the full logits (more memory at long lengths)",
                type(model).__name__,
            )
            head.chunked = False
        _HEADS[model] = head
    return head


def _agrees(model: Any, head: LMHead) -> bool:
    """Whether the chunked logits equal the model's own on a short float32 input."""
    import torch

    vocab = int(getattr(head.module, "out_features", 0) or 0)
    if vocab < 1:
        return False
    generator = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, 8), generator=generator).to(device)
    mask = torch.ones_like(ids)
    positions = torch.arange(8, device=device)[None]
    try:
        with torch.inference_mode():
            full = model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits.float()
            ours = head.logits(head.hidden_states(model, ids, mask, positions)).float()
    except (RuntimeError, TypeError, AttributeError) as exc:
        log.debug("probe: chunked LM head check failed: %s", exc)
        return False
    return ours.shape == full.shape and bool(torch.allclose(ours, full, rtol=1e-4, atol=1e-4))


def padded(rows: Sequence[Sequence[float]]) -> tuple[Any, Any]:
    """Ragged per-sequence values as a NaN-padded float64 ``[rows, width]`` tensor and the
    mask of the real entries."""
    import torch

    width = max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), max(width, 1)), math.nan, dtype=torch.float64)
    mask = torch.zeros_like(values, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = True
    return values, mask


@checked
def measure(
    train: Sequence[Sequence[float]], rollout: Sequence[Sequence[float]]
) -> MismatchMetrics:
    """``compute_mismatch`` over ragged per-sequence log-prob lists (the same tokens on both
    sides: sequence ``i`` has as many log-probs in ``train`` as in ``rollout``)."""
    if [len(r) for r in train] != [len(r) for r in rollout]:
        raise PrecisionConfigError(
            f"measure(): arguments 'train' and 'rollout' hold {len(train)} and {len(rollout)} "
            f"sequences of different lengths; pass the log-probs of the same tokens on both sides."
        )
    train_t, mask = padded(train)
    roll_t, _ = padded(rollout)
    return compute_mismatch(train_t, roll_t, mask)


@checked
def self_check(metrics: MismatchMetrics, settings: MetricSettings) -> SelfCheck:
    """Judge the float32 run: both paths must agree to rounding noise (k3 below the threshold)."""
    threshold = settings.self_check_k3_max
    k3 = metrics.k3_kl
    if metrics.tokens == 0 or not math.isfinite(k3):
        return SelfCheck(False, k3, threshold, "float32 self-check: no comparable tokens.")
    if k3 <= threshold:
        return SelfCheck(
            True, k3, threshold, f"float32 paths agree (k3 {k3:.2e} <= {threshold:g})."
        )
    return SelfCheck(
        False,
        k3,
        threshold,
        f"float32 self-check FAILED: k3 {k3:.2e} > {threshold:g}, so the rollout and trainer "
        f"paths differ for a reason other than precision (padding, attention mask, position "
        f"ids, temperature or sampling settings, TF32 matmuls, different weights) and the "
        f"other dtypes' numbers are not a precision measurement.",
    )


# -- the run ---------------------------------------------------------------------------------
