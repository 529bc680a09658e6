"""Rollout engines for the probe: the interface and the built-in HF engine.

A rollout engine samples completions the way an RL rollout does and returns, for every sampled
token, the log-probability the engine itself assigned to it (for the probe: temperature 1, full
vocabulary, no top-k/top-p), so it can be compared with the trainer's full-sequence log-softmax.
"""

from __future__ import annotations

import copy as copying
import functools
import inspect
import itertools
import logging
import os
import re
from pathlib import Path
from typing import Annotated, Any

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import at_least, checked, dtype_name, duck, usable_device
from precision_plugin._base.constraints import AtMost
from precision_plugin._core.rollout import RolloutEngine, RolloutSample
from precision_plugin._core.sampling import LogitsProcessor, SamplingSettings
from precision_plugin._core.scoring import float16_cpu, packed_cpu
from precision_plugin._core.scoring.float16_cpu import widen_float16
from precision_plugin._core.scoring.fused_cpu import fuse_shared_inputs
from precision_plugin._core.scoring.hf import position_limit
from precision_plugin._core.scoring.kvcache import decode_buffers, drop_rows
from precision_plugin._core.scoring.multinomial_cpu import Multinomial
from precision_plugin._core.scoring.packed_cpu import pack_linears
from precision_plugin.errors import PrecisionConfigError

__all__ = [
    "HFRolloutEngine",
    "RolloutEngine",
    "RolloutSample",
    "hf_engine_factory",
    "load_causal_lm",
]

log = logging.getLogger("precision_plugin")

#: Largest seed a torch generator takes (64 bits); prompt ``i`` is seeded with ``seed + i``.
_MAX_TORCH_SEED = 2**64 - 1


@checked(device=usable_device)
def load_causal_lm(model_path: str, device: str) -> tuple[Any, Any]:
    """Load a local HF causal-LM checkpoint in float32 on ``device``, in eval mode.

    Returns ``(model, tokenizer)``. Loads in float32 whatever the checkpoint's dtype, so callers
    decide the precision (``.to(dtype)`` for a rollout copy, autocast for the trainer path).
    ``model_path`` must be a local checkpoint folder (:func:`checkpoint_folder`): the plugin
    never downloads, so a Hub id is refused before transformers, which reads local files only.
    """
    model_path = str(checkpoint_folder(model_path))  # before transformers is imported
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # transformers reports weights that do not fit the config as a multi-line warning table
    # and loads anyway, randomly initialised; here they are one error.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_path, output_loading_info=True, local_files_only=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = list(info.get("missing_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    if missing or mismatched:
        first = (missing or [str(m[0]) if isinstance(m, tuple) else str(m) for m in mismatched])[0]
        raise ValueError(
            f"its weights do not match its config.json (model_type "
            f"{getattr(model.config, 'model_type', '?')!r}): {len(missing)} weight(s) missing "
            f"and {len(mismatched)} of another shape, e.g. {first!r}; they would be random. "
            f"Check model_type and the sizes in config.json"
        )
    _check_loaded(model)
    model = model.to(device=device, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    return model, tokenizer


# The files a tokenizer is loaded from (fast, sentencepiece, BPE and WordPiece vocabularies);
# without any of them transformers silently builds an empty tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
)


# A Hub model id: "name" or "owner/name" (letters, digits, '-', '_', '.'; no path syntax).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def looks_like_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hugging Face Hub id (``owner/name``) rather than a path."""
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text and not text.startswith(".")


def checkpoint_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` (``~`` expanded) once it is a local HF checkpoint folder: a path the OS can
    take, a folder on this machine with ``config.json`` and tokenizer files. The plugin never
    downloads: a Hub id, or anything that is not such a folder here, is refused in one line
    (``probe.check_model_dir`` for the probe's ``--model``, and every loader of this module,
    before transformers could reach for the network)."""
    folder = Path(userfiles.check_path(path, "model"))  # a path the OS can take, ~ expanded
    if not folder.exists() and looks_like_hub_id(str(path)):
        raise PrecisionConfigError(
            f"model: {path!r} does not exist as a local folder; it looks like a Hugging Face Hub "
            f"id, and the probe downloads nothing. Fetch the checkpoint once on a machine with "
            f"network: `hf download {path} --local-dir ./{Path(str(path)).name}` (the "
            f"huggingface_hub CLI; `huggingface-cli download` in versions before 1.0), or in "
            f"Python AutoModelForCausalLM.from_pretrained({str(path)!r}).save_pretrained(PATH) "
            f"and the same for AutoTokenizer; then pass --model with that folder."
        )
    if not folder.exists():
        raise PrecisionConfigError(
            f"model: {path!r} does not exist; pass a local HF checkpoint folder (config.json, "
            f"weights and tokenizer), or omit --model to probe the embedded default model."
        )
    if not folder.is_dir():
        raise PrecisionConfigError(
            f"model: {path!r} is a file, not a folder; pass the checkpoint folder that holds "
            f"config.json, the weights and the tokenizer."
        )
    if not (folder / "config.json").is_file():
        raise PrecisionConfigError(
            f"model: {path!r} has no config.json, so it is not an HF checkpoint; save one with "
            f"model.save_pretrained(PATH) and tokenizer.save_pretrained(PATH)."
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise PrecisionConfigError(
            f"model: {path!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
            f"the probe tokenizes its prompts with the checkpoint's tokenizer: save it there with "
            f"tokenizer.save_pretrained(PATH)."
        )
    return folder


def _check_loaded(model: Any) -> None:
    """Refuse what transformers loads without a word and fails on later, deep in a rollout, or
    silently: a weight holding NaN or inf (sampling then fails on the probabilities), a
    ``sliding_window`` below 1 (the attention mask then fails on its range) and an EOS id the
    model has no logit for (no completion could end)."""
    import torch

    window = getattr(model.config.get_text_config(), "sliding_window", None)
    if isinstance(window, int) and not isinstance(window, bool) and window < 1:
        raise ValueError(
            f"config.json has sliding_window={window}, and a window holds at least 1 token; set "
            f"it to the model's window, or null for none"
        )
    head = model.get_output_embeddings()
    vocab = None if head is None else int(head.weight.shape[0])
    generation = getattr(model, "generation_config", None)
    for where, config in (("config.json", model.config), ("generation_config.json", generation)):
        eos = getattr(config, "eos_token_id", None)
        ids = eos if isinstance(eos, (list, tuple)) else [eos]
        outside = [i for i in ids if isinstance(i, int) and vocab and not 0 <= i < vocab]
        if outside:
            raise ValueError(
                f"{where} has eos_token_id={eos}, outside the model's {vocab} token ids "
                f"(0 .. {vocab - 1}), so no completion could end; set it to the tokenizer's "
                f"EOS id"
            )
    for name, weight in model.named_parameters():
        bad = int((~torch.isfinite(weight)).sum())
        if bad:
            raise ValueError(
                f"its weights hold NaN or inf ({bad} value(s) in {name!r}); the checkpoint is "
                f"broken: save it again from a model whose weights are finite"
            )


@checked(
    model=duck("config", "forward", what="a transformers causal LM (from_pretrained)"),
    dtype=dtype_name,
    device=usable_device,
)
class HFRolloutEngine:
    """Rollout with a KV-cache sampling loop over its own copy of the weights in ``dtype``.

    ``model`` is left as it was: the engine converts a deep copy (its weights, its linear layers'
    classes), and the copy's tensors are ordinary ones even where ``model`` was built under
    ``torch.inference_mode()``. ``copy=False`` converts ``model`` itself, in place, for a caller
    that made the model for the engine (``from_pretrained``, TRL's ``HFRollout``): no second copy
    of the weights in memory.
    The copy is [`cast_model`][precision_plugin._core.buffers.cast_model]'s: the weights in
    ``dtype``,
    the buffers vLLM keeps in float32 (RoPE inverse frequencies) in float32, as vLLM builds its
    model. ``float32_buffers=False`` rounds them too (a plain ``.to(dtype)``; for comparisons).
    A float16 copy on CPU multiplies as a GPU does
    ([`widen_float16`][precision_plugin._core.scoring.float16_cpu.widen_float16]), and every copy on
    CPU multiplies with weights prepacked for oneDNN
    ([`pack_linears`][precision_plugin._core.scoring.packed_cpu.pack_linears]), layers that read one
    input (query, key and value; gate and up) as one product
    ([`fuse_shared_inputs`][precision_plugin._core.scoring.fused_cpu.fuse_shared_inputs]).
    Samples token by token with
    [`SamplingSettings`][precision_plugin._core.sampling.SamplingSettings]
    applied exactly as vLLM applies them (full vocabulary at temperature 1 by default; the
    checkpoint's generation defaults play no part) and records, as each token is sampled, the
    log-prob its ``logprobs_mode`` names: ``raw_logprobs`` (the default) is ``log_softmax`` in
    float32 of the engine's own ``dtype`` logits, ``processed_logprobs`` that of the
    distribution it sampled from. Only the current step's logits are alive, so memory does not
    grow with the generation length beyond the KV cache. Prompts of any lengths are batched with
    left padding, an attention mask that hides the pads and position ids ``0..T-1`` counted from
    each row's first real token, exactly as in a trainer's unpadded full forward.
    Used by the probe and by TRL's [`HFRollout`][precision_plugin.trl.HFRollout].
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        dtype: str,
        device: str,
        *,
        float32_buffers: bool = True,
        copy: bool = True,
    ) -> None:
        import torch

        from precision_plugin._core.buffers import cast_model

        if copy or _holds_inference_tensors(model):
            # An inference tensor has no version counter, which the packed layers read to see
            # a weight synced in place; a deep copy made here holds ordinary tensors.
            model = copying.deepcopy(model)
        self.dtype = dtype
        self.device = device
        self.model = cast_model(model, dtype, device, float32=float32_buffers).eval()
        widen_float16(self.model)
        pack_linears(self.model)
        self._eos: set[int] = set()
        self._context_warned = False
        # Some checkpoints name their EOS ids only in generation_config.json.
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            eos = getattr(source, "eos_token_id", None)
            self._eos.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = getattr(self.model.config, "pad_token_id", None)
        self._pad = pad if pad is not None else (min(self._eos) if self._eos else 0)
        # A PEFT wrapper forwards **kwargs: read the argument names off the base model.
        base = getattr(self.model, "get_base_model", lambda: self.model)()
        names = inspect.signature(base.forward).parameters
        self._keep_last = "logits_to_keep" in names
        # transformers >= 5.2x names the KV cache ``cache`` (``past_key_values`` is deprecated).
        self._cache_arg = "cache" if "cache" in names else "past_key_values"
        self._torch = torch

    @classmethod
    def from_pretrained(
        cls, model_path: str, dtype: str, device: str, *, float32_buffers: bool = True
    ) -> HFRolloutEngine:
        """Load ``model_path`` and keep a ``dtype`` copy of its weights on ``device``."""
        model, _ = load_causal_lm(model_path, device)
        return cls(model, dtype, device, float32_buffers=float32_buffers, copy=False)

    @checked(
        max_new_tokens=at_least(1, why="the most tokens a completion may have"),
        seed=at_least(0),
        min_new_tokens=at_least(0),
    )
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        seed: int,
        *,
        sampling: SamplingSettings | None = None,
        min_new_tokens: Annotated[int, AtMost("max_new_tokens")] = 0,
        budgets: list[int] | None = None,
    ) -> list[RolloutSample]:
        """Sample one completion per prompt; a completion stops after its first EOS token.

        Prompts of any lengths are batched together, LEFT padded: the attention mask hides the
        pads and position ids count from each row's first real token, so a row sees exactly
        what it sees alone (and what the trainer's unpadded forward sees). Prompt ``i`` samples
        from its own generator seeded with ``seed + i``, so its completion does not depend on
        which other prompts share the batch (the global RNG is left alone).

        ``sampling``: temperature, top-k/top-p/min-p, penalties and the log-prob mode
        ([`SamplingSettings`][precision_plugin._core.sampling.SamplingSettings]; default: full
        distribution at temperature 1, raw log-probs). ``min_new_tokens``: no EOS is sampled
        before that many tokens (vLLM's ``min_tokens``: EOS set to ``-inf`` first); a raw
        log-prob is still that of the unmasked distribution, which is what the trainer scores.
        ``budgets``: one cap per prompt (at most ``max_new_tokens``), as vLLM takes a
        ``max_tokens`` per request. A row that reaches its cap or EOS leaves the batch, as a
        finished request leaves vLLM's: the rows still running compute no more than they would
        have (each row's products and attention are its own; ``packed_cpu`` keeps the products
        batch-invariant). A completion also stops where prompt and completion reach the model's
        ``max_position_embeddings``, as vLLM stops a request at ``max_model_len`` (with a
        warning). Extra settings are keyword-only.
        """
        torch = self._torch
        sampling = sampling if sampling is not None else SamplingSettings()
        if not isinstance(sampling, SamplingSettings):
            raise PrecisionConfigError(
                f"generate(sampling=...): expected a SamplingSettings, got "
                f"{type(sampling).__name__}; pass e.g. SamplingSettings(temperature=0.7)."
            )
        if not prompts:
            return []
        self._check_prompts(prompts)
        if seed + len(prompts) - 1 > _MAX_TORCH_SEED:
            raise PrecisionConfigError(
                f"HFRolloutEngine.generate(): seed {seed} is too large: prompt i is sampled with "
                f"seed + i, and with {len(prompts)} prompt(s) that passes torch's largest seed "
                f"(2**64 - 1); pass a seed <= {_MAX_TORCH_SEED - len(prompts) + 1}."
            )
        caps = [max_new_tokens] * len(prompts) if budgets is None else list(budgets)
        if len(caps) != len(prompts) or any(
            isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= max_new_tokens
            for c in caps
        ):
            raise PrecisionConfigError(
                f"generate(budgets=...): expected one whole number from 1 to max_new_tokens "
                f"({max_new_tokens}) per prompt ({len(prompts)}), got {budgets!r}; pass e.g. "
                f"[{max_new_tokens}] * {len(prompts)}."
            )
        caps = self._fit_context(prompts, caps)
        width = max(len(p) for p in prompts)
        ids = torch.tensor(
            [[self._pad] * (width - len(p)) + list(p) for p in prompts], device=self.device
        )
        real = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device
        )
        generators = [
            torch.Generator(device=self.device).manual_seed(seed + i) for i in range(len(prompts))
        ]
        with torch.inference_mode():
            return self._generate_batch(
                ids, real, caps, generators, sampling, min_new_tokens, prompts
            )

    def _check_prompts(self, prompts: list[list[int]]) -> None:
        """Refuse an empty prompt and a token id the model has no embedding for."""
        embeddings = getattr(self.model, "get_input_embeddings", lambda: None)()
        vocab = getattr(embeddings, "num_embeddings", None)
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise PrecisionConfigError(
                    f"HFRolloutEngine.generate(): prompt {i} is empty, so the first token has "
                    f"nothing to be sampled from; pass at least one token per prompt (e.g. the "
                    f"BOS id)."
                )
            low, top = min(prompt), max(prompt)
            if low < 0:
                raise PrecisionConfigError(
                    f"HFRolloutEngine.generate(): token id {low} in prompt {i} is negative; "
                    f"pass the tokenizer's ids (0 and up)."
                )
            if isinstance(vocab, int) and top >= vocab:
                raise PrecisionConfigError(
                    f"HFRolloutEngine.generate(): token id {top} in prompt {i} is past the "
                    f"model's {vocab} embeddings; pass ids from this model's tokenizer."
                )

    def _fit_context(self, prompts: list[list[int]], caps: list[int]) -> list[int]:
        """Each prompt's cap, cut where prompt and completion would pass the model's
        ``max_position_embeddings``, as vLLM stops a request at ``max_model_len`` (finish reason
        ``length``), with a warning the first time: positions the model never learned would
        give log-probs with no error of their own, and the trainer's scorer refuses such
        sequences. A prompt that leaves no room for one new token is refused."""
        limit = position_limit(self.model)
        if limit is None:
            return caps
        fitted, cut = [], []
        for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
            room = limit - len(prompt)
            if room < 1:
                raise PrecisionConfigError(
                    f"HFRolloutEngine.generate(): prompt {i} is {len(prompt)} tokens, and the "
                    f"model reads at most max_position_embeddings={limit} tokens, prompt and "
                    f"completion together, so no token fits after it; shorten it to fewer than "
                    f"{limit} tokens."
                )
            fitted.append(min(cap, room))
            if room < cap:
                cut.append(i)
        if cut:
            i = cut[0]
            # once per engine: a TRL run with long prompts calls generate() every step
            report = log.debug if self._context_warned else log.warning
            self._context_warned = True
            report(
                "HFRolloutEngine.generate(): %d prompt(s) would pass max_position_embeddings=%d "
                "before their %d new tokens; their completions stop at the limit, as vLLM stops "
                "them at max_model_len (e.g. prompt %d, %d tokens: at most %d new tokens).",
                len(cut), limit, caps[i], i, len(prompts[i]), fitted[i],
            )  # fmt: skip
        return fitted

    def _attention_mask(self, ids: Any, real: Any) -> Any:
        """The prompt's attention mask: its real tokens (``real``: 1, left padding: 0)."""
        del ids
        return real

    def _forward(self, ids: Any, mask: Any, positions: Any, past: Any) -> tuple[Any, Any]:
        """One forward; returns the last position's logits and the KV cache."""
        extra = {"logits_to_keep": 1} if self._keep_last else {}
        if past is not None:
            extra[self._cache_arg] = past
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra
        )
        return out.logits[:, -1], out[self._cache_arg]

    def _generate_batch(
        self,
        ids: Any,
        real: Any,
        caps: list[int],
        generators: list[Any],
        sampling: SamplingSettings,
        min_new_tokens: int,
        prompts: list[list[int]],
    ) -> list[RolloutSample]:
        torch = self._torch
        batch = ids.shape[0]
        steps = max(caps)
        mask = self._attention_mask(ids, real)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        tokens = torch.full((batch, steps), self._pad, dtype=torch.long, device=ids.device)
        token_logp = torch.zeros((batch, steps), dtype=torch.float32, device=ids.device)
        lengths = torch.tensor(caps, dtype=torch.long, device=ids.device)
        eos = torch.tensor(sorted(self._eos), dtype=torch.long, device=ids.device)
        # The mask and the KV cache are allocated once for the whole generation, and each step
        # sees views of their filled part (the same values as growing them by torch.cat).
        width = ids.shape[1]
        full_mask, past = decode_buffers(self.model, mask, steps)
        # The first forward also finds the layers that read one input (fused_cpu).
        logits, past = fuse_shared_inputs(
            self.model,
            functools.partial(self._forward, ids, mask, positions, past),
            (packed_cpu.PackedLinear, float16_cpu.Float16Linear),
        )
        processor = LogitsProcessor(sampling, prompts, logits.shape[-1], ids.device)
        processed_mode = sampling.logprobs_mode == "processed_logprobs"
        next_position = positions[:, -1:] + 1
        live = torch.arange(batch, device=ids.device)  # the prompt of each row still running
        done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        # torch.multinomial's tokens and generator states, in fewer passes (multinomial_cpu).
        draws = Multinomial(generators)
        for t in range(steps):
            processed = processor.process(logits, eos if t < min_new_tokens else None)
            probs = processed.softmax(dim=-1)  # [rows, vocab], float32
            token = draws.sample(probs, live.tolist())[:, None]  # [rows, 1]
            logp = processed if processed_mode else logits
            token_logp[live, t] = logp.log_softmax(dim=-1, dtype=torch.float32).gather(-1, token)[
                :, 0
            ]
            tokens[live, t] = token[:, 0]
            processor.add(token)
            ended = ~done & torch.isin(token[:, 0], eos)
            lengths[live[ended]] = t + 1
            done |= ended | (lengths[live] <= t + 1)
            if t + 1 == steps or bool(done.all()):
                break
            keep = (~done).nonzero()[:, 0]
            # Finished rows leave the batch (their cache rows, mask and sampling state), where
            # the cache can drop rows; elsewhere they run on and their tokens are not kept.
            if len(keep) < len(live) and drop_rows(past, keep):
                live, token, done = live[keep], token[keep], done[keep]
                full_mask, next_position = full_mask[keep], next_position[keep]
                processor.keep(keep)
            mask = full_mask[:, : width + t + 1]
            logits, past = self._forward(token, mask, next_position, past)
            next_position = next_position + 1
        draws.close()
        del past
        samples = []
        for b in range(batch):
            end = int(lengths[b])
            pads = ids.shape[1] - int(real[b].sum())
            samples.append(
                RolloutSample(
                    prompt_ids=ids[b, pads:].tolist(),
                    completion_ids=tokens[b, :end].tolist(),
                    logprobs=token_logp[b, :end].tolist(),
                    meta={"engine": self.name, "dtype": self.dtype},
                )
            )
        return samples

    def close(self) -> None:
        """Drop the weights (and the CUDA cache when on a GPU)."""
        self.model = None
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()


def _holds_inference_tensors(model: Any) -> bool:
    """Whether any parameter or buffer of ``model`` was made under ``torch.inference_mode()``."""
    return any(t.is_inference() for t in itertools.chain(model.parameters(), model.buffers()))


@checked(dtype=dtype_name, device=usable_device, seed=at_least(0))
def hf_engine_factory(
    model_path: str, dtype: str, device: str, seed: int, *, float32_buffers: bool = True
) -> HFRolloutEngine:
    """``precision_probe_engines`` factory of the built-in ``hf`` engine."""
    del seed  # sampling is seeded per generate() call
    return HFRolloutEngine.from_pretrained(
        model_path, dtype, device, float32_buffers=float32_buffers
    )
