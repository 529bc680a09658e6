"""What every rollout engine returns: the sampled tokens with the engine's own log-probs.

The shared types of the rollout side, imported downward by the probe's HF engine, vLLM's probe
engine and TRL's ``HFRollout`` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from precision_plugin._base.boundary import checked


@checked
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
        """Sample one completion per prompt (temperature 1) with the sampled tokens' log-probs.

        Engines may accept further keyword-only settings (the HF engine takes ``temperature``).
        """
        ...

    def close(self) -> None:
        """Release the engine's memory (weights, KV cache, worker processes)."""
        ...
