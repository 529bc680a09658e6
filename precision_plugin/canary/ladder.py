"""The precision ladder (``precision/level``): which level of agreement a run has proved.

- **1, one dtype on every wire**: the asked-vs-ran audit found no contradiction (learner, rollout
  engine and weight sync run the policy dtype). What the plugin proved before the ladder.
- **2, the rollout engine is batch-invariant**: certified by ``certify_batch_invariance``: the
  canary
  rescored at batch size 1 and at batch size N in shuffled order, and generated again at batch 1
  and at batch N with fixed per-sequence seeds (decode included), all equal bit for bit.
- **3, train == rollout**: level 2, and the canary's ``bitwise_equal_frac`` is 1 *and* the
  per-batch ``bitwise_equal_frac`` (the real rollouts' log-probs, from decode, against the
  learner's) is 1.

Level 0: not even one dtype (a contradiction the audit reported). Each level needs the ones
below it; a level is claimed only on evidence, so a run that did not certify a level reports the
one below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from precision_plugin.boundary import at_least, checked, duck
from precision_plugin.scoring import (
    BitwiseEqual,
    TokenSequence,
    batch_rescore,
    bitwise_equal,
)

#: ``generate(prompts, max_new_tokens, seed)``: one batch; row ``i`` samples with seed
#: ``seed + i`` (``HFRolloutEngine.generate``'s contract); returns objects with
#: ``completion_ids`` and ``logprobs``.
Generate = Callable[[list[list[int]], int, int], Sequence[Any]]


@checked(rescore=duck("equal", "batch_size", what="a BatchRescore (batch_rescore's result)"))
@dataclass(frozen=True)
class Invariance:
    """The level-2 evidence: the rescore at batch 1 against batch N (``rescore``) and, when a
    generator was given, generation at batch 1 against N (``generated``: log-probs bit-equal,
    ``same_tokens``: every sequence sampled the same tokens)."""

    rescore: Any  # a BatchRescore
    generated: BitwiseEqual | None
    same_tokens: bool | None

    @property
    def certified(self) -> bool:
        """All bit-equal: the scoring path, and the decode path where it was checked."""
        scored = self.rescore.equal.total > 0 and self.rescore.equal.fraction == 1.0
        if self.generated is None:
            return scored
        return scored and bool(self.same_tokens) and self.generated.fraction == 1.0

    def summary(self) -> str:
        """One line: what matched and what did not."""
        parts = [
            f"rescore at batch 1 vs {self.rescore.batch_size}: "
            f"{self.rescore.equal.equal}/{self.rescore.equal.total} log-probs bit-equal "
            f"(max |diff| {self.rescore.max_abs_diff:.3g})"
        ]
        if self.generated is not None:
            tokens = "same tokens" if self.same_tokens else "DIFFERENT tokens"
            parts.append(
                f"generation at batch 1 vs N: {tokens}, {self.generated.equal}/"
                f"{self.generated.total} log-probs bit-equal"
            )
        return "; ".join(parts)


@checked(
    scorer=duck("score", what="a Scorer (precision_plugin.scoring)"),
    batch_size=at_least(2),
    max_new_tokens=at_least(1),
    seed=at_least(0),
)
def certify_batch_invariance(
    scorer: Any,
    sequences: Sequence[TokenSequence],
    batch_size: int,
    *,
    generate: Generate | None = None,
    max_new_tokens: int = 8,
    seed: int = 0,
) -> Invariance:
    """Level 2's check of a rollout engine: rescore ``sequences`` alone and in shuffled batches of
    ``batch_size``; with ``generate``, sample every prompt alone (seed ``seed + i``) and all
    together in batches of ``batch_size`` (row ``i`` again with ``seed + i``), and compare the
    tokens and their log-probs bit for bit."""
    rescore = batch_rescore(scorer, sequences, batch_size, seed=seed)
    if generate is None:
        return Invariance(rescore, None, None)
    prompts = [list(s.prompt_ids) for s in sequences]
    alone = [generate([p], max_new_tokens, seed + i)[0] for i, p in enumerate(prompts)]
    together: list[Any] = []
    for first in range(0, len(prompts), batch_size):
        together.extend(generate(prompts[first : first + batch_size], max_new_tokens, seed + first))
    same = all(
        list(a.completion_ids) == list(b.completion_ids)
        for a, b in zip(alone, together, strict=True)
    )
    if not same:
        # Different tokens: compare the shared prefix of each pair (what can be compared).
        pairs = [
            (list(a.logprobs)[:n], list(b.logprobs)[:n])
            for a, b in zip(alone, together, strict=True)
            for n in [_common(a.completion_ids, b.completion_ids)]
        ]
    else:
        pairs = [(list(a.logprobs), list(b.logprobs)) for a, b in zip(alone, together, strict=True)]
    equal = bitwise_equal([p[0] for p in pairs], [p[1] for p in pairs])
    return Invariance(rescore, equal, same)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@checked
def precision_level(
    one_dtype: bool,
    invariance: Invariance | None = None,
    canary_equal_frac: float | None = None,
    batch_equal_frac: float | None = None,
) -> int:
    """The highest level the evidence proves (module docstring); a missing piece of evidence
    (``None``, or NaN) proves nothing."""
    if not one_dtype:
        return 0
    if invariance is None or not invariance.certified:
        return 1
    both = (canary_equal_frac, batch_equal_frac)
    if all(v is not None and not math.isnan(v) and v == 1.0 for v in both):
        return 3
    return 2
