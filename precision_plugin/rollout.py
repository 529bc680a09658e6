"""Rollout engines for the probe: the interface, and (added by the probe work) the HF engine.

A rollout engine samples completions the way an RL rollout does and returns, for every sampled
token, the log-probability the engine itself assigned to it (temperature 1, full vocabulary,
no top-k/top-p), so it can be compared with the trainer's full-sequence log-softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class RolloutSample:
    """One sampled completion: prompt and completion token ids, and the engine's log-probs.

    ``logprobs[i]`` is the engine's log-probability of ``completion_ids[i]``; ``nan`` where the
    engine did not return one (such tokens are excluded and counted by the metrics).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    meta: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the probe needs from a rollout engine.

    Engines are built by a factory ``factory(model_path, dtype, device, seed) -> RolloutEngine``
    (returned by the ``precision_probe_engines`` hook); ``model_path`` is a local HF checkpoint
    directory, ``dtype`` a canonical name (``float16``/``bfloat16``/``float32``).
    """

    name: str

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, seed: int
    ) -> list[RolloutSample]:
        """Sample one completion per prompt (temperature 1) with the sampled tokens' log-probs."""
        ...

    def close(self) -> None:
        """Release the engine's memory (weights, KV cache, worker processes)."""
        ...
