"""The batch-1-against-N rescore: every sequence scored alone and inside a batch, bit for bit."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from precision_plugin._base.boundary import at_least, checked, same_length
from precision_plugin._base.boundary.typecheck import _show
from precision_plugin._core.scoring.bitwise import BitwiseEqual, bitwise_equal
from precision_plugin._core.scoring.interface import Scorer, TokenSequence
from precision_plugin.errors import PrecisionConfigError


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


@checked(
    same_length(
        "sequences",
        "alone",
        fix="pass one row of log-probs per sequence in alone (or leave alone out)",
    ),
    batch_size=at_least(1),
    seed=at_least(0),
)
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
    pass). Works with any [`Scorer`][precision_plugin._core.scoring.Scorer].
    """
    seqs = list(sequences)
    if alone is not None:
        single = [list(r) for r in alone]
        for i, (row, seq) in enumerate(zip(single, seqs, strict=True)):
            if len(row) != len(seq.completion_ids):
                raise PrecisionConfigError(
                    f"batch_rescore(): alone[{i}] holds {len(row)} log-probs, but sequences[{i}] "
                    f"has {len(seq.completion_ids)} completion tokens; pass in alone each "
                    f"sequence's log-probs scored alone, in the order of sequences (or leave "
                    f"alone out)."
                )
    else:
        single = [_scored(scorer, seqs, [i])[0] for i in range(len(seqs))]
    order = list(range(len(seqs)))
    random.Random(seed).shuffle(order)
    batched: list[list[float]] = [[] for _ in seqs]
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        for i, logp in zip(rows, _scored(scorer, seqs, rows), strict=True):
            batched[i] = logp
    return BatchRescore(batch_size, single, batched, bitwise_equal(single, batched))


def _scored(scorer: Scorer, seqs: list[TokenSequence], rows: list[int]) -> list[list[float]]:
    """``scorer``'s log-probs of ``seqs[i]`` for ``i`` in ``rows`` (one call), checked to hold
    one row per sequence and one log-prob per completion token."""
    label = getattr(scorer, "name", None) or type(scorer).__name__
    got = scorer.score([seqs[i] for i in rows])
    try:
        out = [list(r) for r in got]
    except TypeError:
        out = None
    if out is None or len(out) != len(rows):
        found = f"{len(out)} row(s)" if out is not None else _show(got)
        raise PrecisionConfigError(
            f"batch_rescore(): scorer {label!r} returned {found} for {len(rows)} sequence(s); "
            f"its score() must return one list of log-probs per sequence, in order."
        )
    for i, row in zip(rows, out, strict=True):
        if len(row) != len(seqs[i].completion_ids):
            raise PrecisionConfigError(
                f"batch_rescore(): scorer {label!r} returned {len(row)} log-probs for "
                f"sequences[{i}], which has {len(seqs[i].completion_ids)} completion tokens; "
                f"its score() must return one log-prob per completion token."
            )
    return out
