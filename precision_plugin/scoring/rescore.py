"""The batch-1-against-N rescore: every sequence scored alone and inside a batch, bit for bit."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from precision_plugin.boundary import at_least, checked
from precision_plugin.scoring.bitwise import BitwiseEqual, bitwise_equal
from precision_plugin.scoring.interface import Scorer, TokenSequence


@checked
@dataclass(frozen=True)
class BatchRescore:
    """The same tokens scored alone (``alone``) and inside batches of ``batch_size``
    (``batched``, in the input order), and how many log-probs are bit-identical."""

    batch_size: int
    alone: list[list[float]]
    batched: list[list[float]]
    equal: BitwiseEqual

    @property
    def max_abs_diff(self) -> float:
        """The largest ``|alone - batched|`` over all tokens (0.0 with no token)."""
        return max(
            (abs(a - b) for ra, rb in zip(self.alone, self.batched, strict=True)
             for a, b in zip(ra, rb, strict=True)),
            default=0.0,
        )  # fmt: skip


@checked(batch_size=at_least(1), seed=at_least(0))
def batch_rescore(
    scorer: Scorer,
    sequences: Sequence[TokenSequence],
    batch_size: int,
    *,
    seed: int = 0,
    alone: Sequence[Sequence[float]] | None = None,
) -> BatchRescore:
    """Score each sequence alone (one ``score`` call each) and again in batches of
    ``batch_size`` drawn in a seeded shuffled order, and compare bit for bit.

    An engine whose numbers do not depend on what else is in the batch (batch-invariant) gives
    ``equal.fraction == 1.0``. ``alone``: per-sequence log-probs already scored alone (skips that
    pass). Works with any [`Scorer`][precision_plugin.scoring.Scorer].
    """
    seqs = list(sequences)
    single = [list(r) for r in alone] if alone is not None else [
        scorer.score([s])[0] for s in seqs
    ]  # fmt: skip
    order = list(range(len(seqs)))
    random.Random(seed).shuffle(order)
    batched: list[list[float]] = [[] for _ in seqs]
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        for i, logp in zip(rows, scorer.score([seqs[i] for i in rows]), strict=True):
            batched[i] = list(logp)
    return BatchRescore(batch_size, single, batched, bitwise_equal(single, batched))
