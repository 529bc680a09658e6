"""The vLLM scorer: per-token log-probs of given tokens from a vLLM ``LLM`` (``prompt_logprobs``).

vLLM scores tokens it is given through ``prompt_logprobs``: each prompt position's log-prob
under the model, in float32, of the raw logits (temperature does not touch them; the request
still says ``temperature=1.0`` so nothing else could). One ``score`` call is one
``LLM.generate`` call, one batch as far as the engine's scheduler is concerned.
``prompt_logprobs=1`` returns the top token and the actual one at each position; the actual one
is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from precision_plugin._core.scoring.interface import TokenSequence


def sampling_params(vllm_module: Any = None) -> Any:
    """``SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1)``: score, sample one
    throw-away token."""
    if vllm_module is None:
        import vllm as vllm_module
    return vllm_module.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1)


class VLLMScorer:
    """[`Scorer`][precision_plugin._core.scoring.Scorer] over a vLLM ``LLM`` (colocated engine)."""

    name = "vllm"

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def requests(self, sequences: Sequence[TokenSequence]) -> list[dict[str, list[int]]]:
        """The token prompts sent: prompt and completion ids in one ``prompt_token_ids``."""
        return [{"prompt_token_ids": [*s.prompt_ids, *s.completion_ids]} for s in sequences]

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probs of each completion, read from ``prompt_logprobs``."""
        outputs = self.llm.generate(self.requests(sequences), sampling_params(), use_tqdm=False)
        return [
            completion_logprobs(out.prompt_logprobs, s)
            for out, s in zip(outputs, sequences, strict=True)
        ]


def completion_logprobs(prompt_logprobs: Sequence[Any], sequence: TokenSequence) -> list[float]:
    """The completion tokens' log-probs out of vLLM's per-position ``prompt_logprobs`` (a list
    with ``None`` first, then ``{token_id: Logprob}`` per position)."""
    start = len(sequence.prompt_ids)
    out = []
    for offset, token in enumerate(sequence.completion_ids):
        entry = prompt_logprobs[start + offset][token]
        out.append(float(getattr(entry, "logprob", entry)))
    return out
