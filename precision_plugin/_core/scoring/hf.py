"""The HF scorer: per-token log-probs of given tokens from a transformers causal LM.

Two ways to compute the same numbers, the two an RL system uses:

- **prefill** (``incremental=False``): one full-sequence forward per batch, as a trainer scores;
- **incremental decode** (``incremental=True``): the prompt once, then one token at a time
  against the KV cache, as a rollout engine records log-probs while it samples (teacher-forced:
  the given tokens, not sampled ones).

A batch is LEFT padded, with an attention mask that hides the pads and position ids counted from
each row's first real token, so a row sees exactly what it sees alone; whether its numbers are
bit-identical alone and in a batch depends on the kernels
([`batch_rescore`][precision_plugin._core.scoring.batch_rescore] checks it). ``autocast`` runs the
forward under ``torch.autocast(dtype)`` as a mixed-precision trainer does; a rollout copy instead
holds its weights in the dtype (``precision_plugin._core.buffers.cast_model``) and runs without it.

The LM head runs on a few positions at a time (:class:`LMHead`), so no ``[T, vocab]`` tensor is
built; ``transform`` turns each position's float32 logits into log-probs (default: the full
vocabulary's ``log_softmax``; a sampler's temperature/top-p view is another transform).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from precision_plugin._base.boundary import (
    at_least,
    checked,
    dtype_name,
    torch_module,
    usable_device,
)
from precision_plugin._base.boundary.typecheck import _show
from precision_plugin._core.scoring.float16_cpu import float16_autocast_linears
from precision_plugin._core.scoring.interface import TokenSequence
from precision_plugin._core.scoring.kvcache import decode_buffers, drop_rows
from precision_plugin.errors import PrecisionConfigError

log = logging.getLogger("precision_plugin")

#: ``transform(logits, positions) -> log-probs``: ``logits`` float32 ``[n, vocab]``,
#: ``positions`` each row's completion index (``[n]``, long); returns ``[n, vocab]``.
LogprobTransform = Callable[[Any, Any], Any]

#: Logits computed at once: positions per chunk = this // vocabulary size (16 Mi logits, 64 MiB
#: in float32), so memory does not grow with the sequence length.
CHUNK_LOGITS = 1 << 24


def position_limit(model: Any) -> int | None:
    """The most positions ``model`` reads, prompt and completion together: its (text) config's
    ``max_position_embeddings``, or ``None`` where the config names no whole number >= 1."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return None
    return limit


@checked(dtype=dtype_name, device=usable_device)
@contextlib.contextmanager
def trainer_precision(dtype: str, device: str) -> Iterator[None]:
    """Autocast to ``dtype`` as a mixed-precision trainer does (nothing for float32) on
    ``device``, which must be one torch can run on here (torch's autocast would warn and run
    float32 on a CUDA device the machine lacks; here that is one error).

    float16 on CPU multiplies as a GPU does (float32 accumulation, one rounding), and so does
    bfloat16 on a CPU without native bfloat16 products:
    [`float16_cpu`][precision_plugin._core.scoring.float16_cpu].
    """
    import torch

    if dtype == "float32":
        yield
        return
    kind = device.split(":", 1)[0]
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type=kind, dtype=getattr(torch, dtype)))
        if kind == "cpu" and dtype in ("float16", "bfloat16"):
            # float16: products and attention as a GPU computes them; bfloat16: attention, and
            # the products where the CPU has no native bfloat16 kernel (float16_cpu).
            stack.enter_context(float16_autocast_linears())
        yield


def log_softmax(logits: Any, positions: Any) -> Any:
    """The default transform: the full vocabulary's ``log_softmax`` (what a trainer scores)."""
    del positions
    return logits.log_softmax(dim=-1)


@checked(
    model=torch_module,
    batch_size=at_least(1),
    chunk_logits=at_least(1),
    autocast=dtype_name,
)
class HFScorer:
    """[`Scorer`][precision_plugin._core.scoring.Scorer] over a transformers causal LM (module
    docstring).

    ``model``: the weights as they are (a rollout copy cast to its dtype, or float32 master
    weights with ``autocast``). ``batch_size``: sequences per forward (a ``score`` call is split
    into batches of at most this many, in order). ``incremental``: KV-cache decode instead of
    one prefill forward. ``transform``: float32 logits to log-probs (default ``log_softmax``).
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        *,
        autocast: str = "float32",
        batch_size: int = 1,
        incremental: bool = False,
        transform: LogprobTransform | None = None,
        chunk_logits: int = CHUNK_LOGITS,
    ) -> None:
        self.model = model
        self.autocast = autocast
        self.batch_size = batch_size
        self.incremental = incremental
        self.transform = transform or log_softmax
        self.chunk_logits = chunk_logits
        self.device = str(next(model.parameters()).device)
        self.head = lm_head_of(model)
        base = getattr(model, "get_base_model", lambda: model)()
        names = inspect.signature(base.forward).parameters
        # transformers >= 5.2x names the KV cache ``cache`` (``past_key_values`` is deprecated).
        self._cache_arg = "cache" if "cache" in names else "past_key_values"

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probs of each sequence's completion (empty completions give ``[]``)."""
        out: list[list[float]] = [[] for _ in sequences]
        # The embedding table's size where the model has the usual accessor (a wrapped model
        # may not: then the model itself reports a bad id).
        embeddings = getattr(self.model, "get_input_embeddings", lambda: None)()
        vocab = getattr(embeddings, "num_embeddings", None)
        top = max((max((*s.prompt_ids, *s.completion_ids)) for s in sequences), default=0)
        if isinstance(vocab, int) and top >= vocab:
            raise PrecisionConfigError(
                f"HFScorer.score(): token id {top} is past the model's {vocab} embeddings; "
                f"pass ids from this model's tokenizer."
            )
        todo = [i for i, s in enumerate(sequences) if s.completion_ids]
        self._check_lengths(sequences, todo)
        run = self._decode if self.incremental else self._prefill
        for first in range(0, len(todo), self.batch_size):
            rows = todo[first : first + self.batch_size]
            for i, logp in zip(rows, run([sequences[i] for i in rows]), strict=True):
                out[i] = logp
        return out

    def _check_lengths(self, sequences: Sequence[TokenSequence], todo: list[int]) -> None:
        """Refuse a sequence longer than the model's ``max_position_embeddings`` (where its
        config names one): past it, positions the model never learned give numbers with no
        error of their own."""
        limit = position_limit(self.model)
        if limit is None:
            return
        for i in todo:
            prompt, completion = len(sequences[i].prompt_ids), len(sequences[i].completion_ids)
            if prompt + completion > limit:
                raise PrecisionConfigError(
                    f"HFScorer.score(): sequence {i} is {prompt + completion} tokens long "
                    f"(prompt {prompt} + completion {completion}), and the model reads at most "
                    f"max_position_embeddings={limit} tokens, prompt and completion together; "
                    f"shorten it to at most {limit} tokens."
                )

    def _padded(self, seqs: list[list[int]]) -> tuple[Any, Any, Any]:
        import torch

        width = max(len(seq) for seq in seqs)
        pad = pad_id(self.model)
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=self.device)
        mask = torch.tensor(
            [[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=self.device
        )
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _prefill(self, batch: Sequence[TokenSequence]) -> list[list[float]]:
        import torch

        seqs = [list(s.prompt_ids) + list(s.completion_ids) for s in batch]
        ids, mask, positions = self._padded(seqs)
        width = ids.shape[1]
        # Row b's completion fills its last n_b columns; its tokens are predicted one column
        # earlier.
        rows = torch.cat([torch.full((len(s.completion_ids),), b) for b, s in enumerate(batch)])
        cols = torch.cat(
            [torch.arange(width - len(s.completion_ids) - 1, width - 1) for s in batch]
        ).to(self.device)
        index = torch.cat([torch.arange(len(s.completion_ids)) for s in batch]).to(self.device)
        targets = ids[rows.to(self.device), cols + 1]
        with torch.inference_mode(), trainer_precision(self.autocast, self.device):
            hidden = self.head.hidden_states(self.model, ids, mask, positions)
            logp = self.head.token_logprobs(
                hidden[rows.to(self.device), cols],
                targets,
                self.chunk_logits,
                transform=self.transform,
                positions=index,
            )
        flat = logp.tolist()
        out, at = [], 0
        for s in batch:
            out.append(flat[at : at + len(s.completion_ids)])
            at += len(s.completion_ids)
        return out

    def _decode(self, batch: Sequence[TokenSequence]) -> list[list[float]]:
        import torch

        ids, mask, positions = self._padded([list(s.prompt_ids) for s in batch])
        steps = max(len(s.completion_ids) for s in batch)
        pad = pad_id(self.model)
        tokens = torch.tensor(
            [list(s.completion_ids) + [pad] * (steps - len(s.completion_ids)) for s in batch],
            device=self.device,
        )
        logp = torch.zeros((len(batch), steps), dtype=torch.float32, device=self.device)
        # Mask and KV cache allocated once; each step sees views of their filled part.
        width = ids.shape[1]
        full_mask, past = decode_buffers(self.model, mask, steps)
        lengths = torch.tensor([len(s.completion_ids) for s in batch], device=self.device)
        live = torch.arange(len(batch), device=self.device)  # the rows still running
        with torch.inference_mode(), trainer_precision(self.autocast, self.device):
            hidden, past = self._step(ids, mask, positions, past)
            position = positions[:, -1:]
            for t in range(steps):
                index = torch.full((len(live),), t, dtype=torch.long, device=self.device)
                logp[live, t] = self.head.token_logprobs(
                    hidden, tokens[live, t], self.chunk_logits, self.transform, index
                )
                if t + 1 == steps:
                    break
                # A finished sequence leaves the batch, as in the rollout engine's loop
                # (HFRolloutEngine), so each row is computed in the same company as there.
                keep = (lengths[live] > t + 1).nonzero()[:, 0]
                if len(keep) < len(live) and drop_rows(past, keep):
                    live, full_mask, position = live[keep], full_mask[keep], position[keep]
                mask = full_mask[:, : width + t + 1]
                position = position + 1
                hidden, past = self._step(tokens[live, t : t + 1], mask, position, past)
        del past
        return [logp[b, : len(s.completion_ids)].tolist() for b, s in enumerate(batch)]

    def _step(self, ids: Any, mask: Any, positions: Any, past: Any) -> tuple[Any, Any]:
        """One cached forward: the last position's LM-head input (or logits), and the cache."""
        extra = {self._cache_arg: past} if past is not None else {}
        if not self.head.chunked:
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra
            )
            return out.logits[:, -1], out[self._cache_arg]
        with self.head.last_input() as seen:
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra
            )
        return seen[0][:, -1], out[self._cache_arg]


def pad_id(model: Any) -> int:
    """The model's pad token id (0 when its config names none)."""
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

    @contextlib.contextmanager
    def last_input(self) -> Iterator[list[Any]]:
        """While open, every forward's LM head sees only its last position; the full input it
        was given is appended to the yielded list."""
        seen: list[Any] = []

        def keep_last(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            if not args:
                return None
            seen.append(args[0])
            return (args[0][:, -1:], *args[1:])

        handle = self.module.register_forward_pre_hook(keep_last)
        try:
            yield seen
        finally:
            handle.remove()
        if len(seen) != 1:
            raise RuntimeError(f"the LM head ran {len(seen)} times in one forward, not once")

    def hidden_states(self, model: Any, ids: Any, mask: Any, positions: Any) -> Any:
        """``[batch, T, hidden]``: the LM head's input at every position (or the full logits
        when ``chunked`` is False)."""
        if not self.chunked:
            return model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits
        with self.last_input() as seen:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
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

    def token_logprobs(
        self,
        hidden: Any,
        targets: Any,
        chunk_logits: int,
        transform: LogprobTransform | None = None,
        positions: Any = None,
    ) -> Any:
        """``transform`` (default ``log_softmax``) of each row's float32 logits at its target
        token, chunk by chunk; ``positions`` (each row's completion index) goes to it."""
        import torch

        transform = transform or log_softmax
        vocab = self.module.out_features if self.chunked else hidden.shape[-1]
        step = max(1, chunk_logits // max(1, int(vocab)))
        parts = []
        for at in range(0, hidden.shape[0], step):
            logits = self.logits(hidden[at : at + step]).float()
            where = None if positions is None else positions[at : at + step]
            logp = transform(logits, where)
            if not isinstance(logp, torch.Tensor) or logp.shape != logits.shape:
                name = getattr(transform, "__qualname__", type(transform).__name__)
                found = (
                    f"shape {tuple(logp.shape)}" if isinstance(logp, torch.Tensor) else _show(logp)
                )
                raise PrecisionConfigError(
                    f"HFScorer.score(): transform {name!r} returned {found} for float32 logits "
                    f"of shape {tuple(logits.shape)} (positions, vocabulary); it must return "
                    f"one log-prob per logit, a tensor of that same shape (as log_softmax does)."
                )
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
