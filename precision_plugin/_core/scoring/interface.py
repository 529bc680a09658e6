"""The scoring interface every engine implements: score token sequences, return log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from precision_plugin._base.boundary import checked
from precision_plugin.errors import PrecisionConfigError


@checked
@dataclass(frozen=True)
class TokenSequence:
    """A prompt and the completion whose tokens are scored (each token given what precedes it)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        # An empty prompt leaves the first completion token nothing to be predicted from (a
        # scorer would read another position's logits); a negative id names no token.
        if not self.prompt_ids:
            raise PrecisionConfigError(
                "TokenSequence(): prompt_ids is empty, so the first completion token has no "
                "position to be scored from; pass at least one prompt token (e.g. the BOS id)."
            )
        low = min((*self.prompt_ids, *self.completion_ids))
        if low < 0:
            raise PrecisionConfigError(
                f"TokenSequence(): token id {low} is negative; pass the tokenizer's ids (0 and up)."
            )


@checked
def sequences_of(samples: Sequence[object]) -> list[TokenSequence]:
    """``TokenSequence`` of each object with ``prompt_ids`` and ``completion_ids``."""
    return [
        TokenSequence(tuple(s.prompt_ids), tuple(s.completion_ids))  # type: ignore[attr-defined]
        for s in samples
    ]


@runtime_checkable
class Scorer(Protocol):
    """What an engine offers for scoring: the log-prob of each completion token.

    ``score(sequences)`` returns, per sequence, one float per completion token: the engine's
    log-probability of that token given the prompt and the completion tokens before it. One call
    is one batch as far as the engine is concerned (a call with one sequence scores it alone);
    [`batch_rescore`][precision_plugin._core.scoring.batch_rescore] relies on that.
    """

    name: str

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probs of each sequence's completion (same order as ``sequences``)."""
        ...
