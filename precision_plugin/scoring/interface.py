"""The scoring interface every engine implements: score token sequences, return log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from precision_plugin.boundary import checked


@checked
@dataclass(frozen=True)
class TokenSequence:
    """A prompt and the completion whose tokens are scored (each token given what precedes it)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


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
    [`batch_rescore`][precision_plugin.scoring.batch_rescore] relies on that.
    """

    name: str

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probs of each sequence's completion (same order as ``sequences``)."""
        ...
