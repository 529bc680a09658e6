"""Sampling settings applied exactly as vLLM applies them, and the log-probs it reports.

vLLM's V1 sampler (``vllm/v1/sample/sampler.py``, 0.33.0) turns one step's logits into a token
in this order (its class docstring, lines 78-115): logits to float32; min-tokens (stop tokens to
``-inf`` until ``min_tokens``); penalties (``ops/penalties.py`` and
``model_executor/layers/utils.py`` ``apply_penalties``: repetition on tokens of the prompt or
the output so far, a positive logit times ``1/penalty`` and a non-positive one times
``penalty``; then frequency times the output counts and presence times the output mask,
subtracted); temperature (``logits / T``); min-p (``logits_processor/builtin.py``: tokens whose
probability is below ``min_p`` times the largest to ``-inf``); top-k and top-p
(``ops/topk_topp_sampler.py`` ``apply_top_k_top_p_pytorch``: ties at the k-th logit kept; top-p
drops the sorted tokens whose cumulative probability from the low end is ``<= 1 - p``, always
keeping the largest); then it samples from ``softmax`` of what is left.

``logprobs_mode="processed_logprobs"`` (what TRL's vLLM path asks for, and the plugin's server
recipes) reports ``log_softmax`` of those processed logits: the distribution the token was
drawn from. ``"raw_logprobs"`` reports ``log_softmax`` of the model's logits, before any of it
(what the probe compares with the trainer's full-vocabulary log-softmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from precision_plugin._base.boundary import (
    Invalid,
    Validator,
    at_least,
    checked,
    in_range,
    positive,
    torch_device,
)

LogprobsMode = Literal["processed_logprobs", "raw_logprobs"]


#: vLLM's ``SamplingParams`` ranges, which TRL's vLLM path passes the settings to.
_VLLM = "vLLM's SamplingParams range"


def _above_zero(high: float, why: str, *, floor: float = 0.0, below: str = "") -> Validator:
    """A number in ``(0, high]``: 0 (greedy, or nothing kept) has no distribution to compare.
    ``floor``: the least value taken (``below`` says why smaller ones are refused)."""
    if floor:
        allowed = f"a number in [{floor:g}, {high:g}] ({why}; {below})"
    else:
        allowed = f"a number in (0, {high:g}] ({why}; 0 has no distribution to compare)"
    closed = in_range(0.0, high)

    def check(value: Any) -> Any:
        try:
            closed(value)
        except Invalid:
            raise Invalid(f"is out of range; allowed: {allowed}") from None
        if value == 0 or value < floor:
            raise Invalid(f"is out of range; allowed: {allowed}")
        return value

    return Validator(allowed, check, (0.0, high + 1.0, math.nan, floor / 10))


#: vLLM samples greedily below this temperature (``_SAMPLING_EPS``, ``v1/sample/sampler.py``).
_GREEDY_BELOW = 1e-5


@checked(
    temperature=_above_zero(
        2.0,
        _VLLM,
        floor=_GREEDY_BELOW,
        below="below 1e-05 vLLM samples greedily, which has no distribution to compare",
    ),
    top_p=_above_zero(1.0, _VLLM),
    top_k=at_least(-1, why=f"{_VLLM}: 0 or -1 (off) or at least 1"),
    min_p=in_range(0.0, 1.0, why=_VLLM),
    repetition_penalty=positive(_VLLM),
    frequency_penalty=in_range(-2.0, 2.0, why=_VLLM),
    presence_penalty=in_range(-2.0, 2.0, why=_VLLM),
)
@dataclass(frozen=True)
class SamplingSettings:
    """What a rollout samples with, each field with vLLM's ``SamplingParams`` meaning.

    ``top_k`` 0 or -1 (or at least the vocabulary size) is off, ``top_p`` 1 is off, ``min_p`` 0
    is off, ``repetition_penalty`` 1 is off, ``frequency_penalty``/``presence_penalty`` 0 are
    off. ``logprobs_mode`` says which log-prob the engine records (see the module docstring).
    Out-of-range values raise [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError]
    naming the setting.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs_mode: LogprobsMode = "raw_logprobs"

    @property
    def penalties(self) -> bool:
        """True when a repetition, frequency or presence penalty is on."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


@checked(device=torch_device)
class LogitsProcessor:
    """One batch's sampling state: the prompt mask and output counts the penalties need.

    [`process`][precision_plugin._core.sampling.LogitsProcessor.process] turns one step's logits
    into
    the processed float32 logits (vLLM's order);
    [`add`][precision_plugin._core.sampling.LogitsProcessor.add] records the tokens just sampled.
    """

    def __init__(self, settings: SamplingSettings, prompts: list[list[int]], vocab: int,
                 device: Any) -> None:  # fmt: skip
        import torch

        self.settings = settings
        self._torch = torch
        self.counts: Any = None
        self.prompt_mask: Any = None
        if settings.penalties:
            self.prompt_mask = torch.zeros((len(prompts), vocab), dtype=torch.bool, device=device)
            for row, ids in enumerate(prompts):
                self.prompt_mask[row, torch.tensor(ids, device=device, dtype=torch.long)] = True
            self.counts = torch.zeros((len(prompts), vocab), dtype=torch.long, device=device)

        # vLLM keeps every setting in a float32 tensor: the same roundings here.
        def f32(value: float) -> Any:
            return torch.tensor(value, dtype=torch.float32, device=device)

        self.temperature = f32(settings.temperature)
        self.repetition = f32(settings.repetition_penalty)
        self.frequency = f32(settings.frequency_penalty)
        self.presence = f32(settings.presence_penalty)
        self.min_p = f32(settings.min_p)
        self.top_p = f32(settings.top_p)
        self.top_k = settings.top_k if 0 < settings.top_k < vocab else None

    def add(self, tokens: Any) -> None:
        """Count the tokens just sampled (``[batch, 1]``) for the penalties."""
        if self.counts is not None:
            self.counts.scatter_add_(1, tokens, self._torch.ones_like(tokens))

    def keep(self, rows: Any) -> None:
        """Keep only the batch rows ``rows`` (their indices, in order): the others finished."""
        if self.counts is not None:
            self.counts = self.counts[rows]
            self.prompt_mask = self.prompt_mask[rows]

    def process(self, logits: Any, stop: Any = None) -> Any:
        """The processed float32 logits of one step (``[batch, vocab]``, a new tensor).

        ``stop``: token ids set to ``-inf`` first (vLLM's min-tokens processor), or ``None``.
        """
        torch = self._torch
        s = self.settings
        logits = logits.to(torch.float32, copy=True)
        if stop is not None and stop.numel():
            logits[:, stop] = -math.inf
        if self.counts is not None:
            output = self.counts > 0
            penalties = torch.where(self.prompt_mask | output, self.repetition, 1.0)
            logits *= torch.where(logits > 0, 1.0 / penalties, penalties)
            logits -= self.frequency * self.counts
            logits -= self.presence * output
        logits = logits / self.temperature
        if s.min_p > 0:
            probs = logits.softmax(dim=-1)
            floor = probs.amax(dim=-1, keepdim=True) * self.min_p
            logits = logits.masked_fill(probs < floor, -math.inf)
        if self.top_k is not None or s.top_p < 1.0:
            logits = self._top_k_top_p(logits)
        return logits

    def _top_k_top_p(self, logits: Any) -> Any:
        """vLLM's ``apply_top_k_top_p_pytorch`` (ascending sort, masks, scatter back)."""
        torch = self._torch
        ordered, index = logits.sort(dim=-1, descending=False)
        if self.top_k is not None:
            kth = ordered[:, ordered.shape[1] - self.top_k].unsqueeze(1)
            ordered = ordered.masked_fill(ordered < kth, -math.inf)
        if self.settings.top_p < 1.0:
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= 1 - self.top_p
            drop[:, -1] = False
            ordered = ordered.masked_fill(drop, -math.inf)
        return torch.empty_like(logits).scatter_(-1, index, ordered)
