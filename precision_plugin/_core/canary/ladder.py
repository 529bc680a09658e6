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
from typing import Annotated, Any

import annotated_types as at

from precision_plugin._base.boundary import at_least, checked, duck
from precision_plugin._base.constraints import Each, Finite, Invalid, Probability, validator_for
from precision_plugin._core.scoring import (
    BitwiseEqual,
    TokenSequence,
    batch_rescore,
    bitwise_equal,
)
from precision_plugin.errors import PrecisionConfigError

#: ``generate(prompts, max_new_tokens, seed)``: one batch; row ``i`` samples with seed
#: ``seed + i`` (``HFRolloutEngine.generate``'s contract); returns objects with
#: ``completion_ids`` and ``logprobs``.
Generate = Callable[[list[list[int]], int, int], Sequence[Any]]
#: Log-probs a level is certified on: finite (an infinite or NaN log-prob is no evidence of
#: agreement: ``inf`` equals ``inf`` bit for bit whatever the engine computed).
_FINITE_ROWS = validator_for(Annotated[Sequence[Sequence[float]], Each(Finite())])


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
    scorer=duck("score", what="a Scorer (precision_plugin._core.scoring)"),
    batch_size=at_least(2),
    max_new_tokens=at_least(1),
    seed=at_least(0),
)
def certify_batch_invariance(
    scorer: Any,
    sequences: Annotated[Sequence[TokenSequence], at.MinLen(1)],
    batch_size: int,
    *,
    generate: Generate | None = None,
    max_new_tokens: int = 8,
    seed: int = 0,
) -> Invariance:
    """Level 2's check of a rollout engine: rescore ``sequences`` alone and in shuffled batches of
    ``batch_size``; with ``generate``, sample every prompt alone (seed ``seed + i``) and all
    together in batches of ``batch_size`` (row ``i`` again with ``seed + i``), and compare the
    tokens and their log-probs bit for bit. A non-finite log-prob (from the scorer or from
    ``generate``), or an answer of ``generate`` that does not hold one sample per prompt with
    one log-prob per token, is refused naming the parameter: no level rests on it."""
    rescore = batch_rescore(scorer, sequences, batch_size, seed=seed)
    label = getattr(scorer, "name", None) or type(scorer).__name__
    for what, rows in (("alone", rescore.alone), ("in batches", rescore.batched)):
        _refuse_non_finite("scorer", f"{label!r}, the sequences scored {what}", rows)
    if generate is None:
        return Invariance(rescore, None, None)
    prompts = [list(s.prompt_ids) for s in sequences]
    alone = [
        _samples(generate([p], max_new_tokens, seed + i), 1, i)[0] for i, p in enumerate(prompts)
    ]
    together: list[Any] = []
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first : first + batch_size]
        together.extend(_samples(generate(batch, max_new_tokens, seed + first), len(batch), first))
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


def _refuse_non_finite(param: str, what: str, rows: Sequence[Sequence[float]]) -> None:
    """Refuse non-finite log-probs that ``param`` answered (``what``: which answer)."""
    try:
        _FINITE_ROWS(rows)
    except Invalid as exc:
        reason = " ".join(str(exc).split()).removeprefix("holds ")
        raise PrecisionConfigError(
            f"certify_batch_invariance(): argument {param!r} ({what}) answered log-probs that "
            f"hold {reason}; no level is certified on them (an infinite or NaN log-prob: the "
            f"engine overflowed or returned none): fix {param}, or leave out the tokens it "
            f"cannot score."
        ) from None


def _samples(answer: Any, prompts: int, first: int) -> list[Any]:
    """``generate``'s answer for ``prompts`` prompts from prompt ``first`` on: one sample per
    prompt, each with ``completion_ids`` and as many finite ``logprobs``; refused otherwise."""
    try:
        out = list(answer)
        rows = [(list(s.completion_ids), list(s.logprobs)) for s in out]
    except (TypeError, AttributeError):
        out, rows = [], None
    if rows is None or len(out) != prompts:
        found = f"{len(out)} sample(s)" if rows is not None else f"{type(answer).__name__}"
        raise PrecisionConfigError(
            f"certify_batch_invariance(): argument 'generate' answered {found} for {prompts} "
            f"prompt(s) (prompts {first} ..); it must return one sample per prompt, in order, "
            f"each with completion_ids and logprobs."
        )
    for i, (ids, logprobs) in enumerate(rows):
        if len(ids) != len(logprobs):
            raise PrecisionConfigError(
                f"certify_batch_invariance(): argument 'generate' answered {len(logprobs)} "
                f"log-probs for the {len(ids)} completion tokens of prompt {first + i}; each "
                f"sample holds one log-prob per completion token."
            )
    _refuse_non_finite("generate", f"prompts {first} ..", [lp for _, lp in rows])
    return out


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
    canary_equal_frac: Probability | None = None,
    batch_equal_frac: Probability | None = None,
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
