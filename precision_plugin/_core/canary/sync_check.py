"""The post-sync check: right after a weight sync, does the rollout engine compute with the
weights it was sent?

A few fixed token sequences are scored three times: by the rollout engine (after the sync), by
the learner in the dtype its forward runs in, and by the learner in float32 (the reference).
Both half-precision sides round the same float32 function, so the engine's distance from the
reference is of the order of the learner's own (its *rounding*): the check measures

    ratio = mean |engine - reference| / max(mean |learner - reference|, FLOOR)

over the tokens, and calls the sync faulty when the ratio exceeds ``FACTOR``. ``FLOOR`` stands in
for float32's rounding, where the learner's own distance is 0. A stale part of the engine (vLLM's
CPU build keeps a prepacked LM head that ``load_weights`` does not refresh; a parameter-name
mapping that drops a layer) shows as a gap of the size of the weight change, which no rounding
explains; a gap below ``FACTOR`` times the rounding is not distinguishable from rounding, and
grows past it as training moves the weights further from the stale copy.

Pure logic over lists of floats; the TRL wiring is ``precision_plugin.trl.sync_check``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from precision_plugin._base.boundary import checked
from precision_plugin._base.dtypes import DTypeName
from precision_plugin._core.scoring.interface import TokenSequence
from precision_plugin.errors import PrecisionConfigError

#: How many times the dtype's own rounding the engine may be off before the sync is faulty.
#: Healthy engines measured: vLLM CPU float16 1.0-1.6x, bfloat16 0.9-1.4x (docs/vllm-cpu.md).
FACTOR = 8.0
#: Mean absolute log-prob gap that stands for float32's rounding (its own gap is 0): two float32
#: implementations of one model differ by ~1e-6 per token on average.
FLOOR = 1e-4
#: The fixed sequences: how many, and their prompt and completion lengths.
SEQUENCES, PROMPT_TOKENS, COMPLETION_TOKENS = 4, 8, 16


@checked
def sync_sequences(vocab_size: int, seed: int = 0) -> list[TokenSequence]:
    """``SEQUENCES`` fixed token sequences over ``range(vocab_size)``, the same for a given
    ``vocab_size`` and ``seed`` on every run and machine."""
    if vocab_size < 2:
        raise PrecisionConfigError(
            f"sync check: a vocabulary of {vocab_size} token(s) was given; it needs at least 2."
        )
    rng = random.Random(seed)
    draw = lambda n: tuple(rng.randrange(vocab_size) for _ in range(n))  # noqa: E731
    return [TokenSequence(draw(PROMPT_TOKENS), draw(COMPLETION_TOKENS)) for _ in range(SEQUENCES)]


@checked
@dataclass(frozen=True)
class SyncCheck:
    """One post-sync check (after weight sync number ``sync``): the engine's and the learner's
    mean absolute log-prob gap to the float32 reference, their ratio, and whether the sync is
    faulty."""

    sync: int
    engine_gap: float
    rounding_gap: float
    ratio: float
    faulty: bool
    tokens: int

    @checked
    def message(self, dtype: DTypeName) -> str:
        """One line saying what was measured and what it means."""
        what = (
            "the engine does not compute with the weights it was sent"
            if self.faulty
            else "the engine computes with the synced weights"
        )
        return (
            f"weight sync {self.sync}: the rollout engine's log-probs of {self.tokens} fixed "
            f"tokens are {self.engine_gap:.3g} nats from the learner's float32 ones on average, "
            f"{self.ratio:.3g}x the {dtype} rounding ({max(self.rounding_gap, FLOOR):.3g}"
            f"{', the float32 floor' if self.rounding_gap < FLOOR else ''}); {what} (threshold "
            f"{FACTOR:g}x)"
        )


def _flat(rows: Sequence[Sequence[float]], name: str) -> list[float]:
    values = [float(v) for row in rows for v in row]
    bad = next((v for v in values if not math.isfinite(v)), None)
    if bad is not None:
        raise PrecisionConfigError(
            f"sync check: the {name} log-probs hold a non-finite value ({bad}); a log-prob is "
            f"finite. Fix: check the {name}'s scoring path."
        )
    return values


@checked
def check_sync(
    sync: int,
    engine: Sequence[Sequence[float]],
    learner: Sequence[Sequence[float]],
    reference: Sequence[Sequence[float]],
) -> SyncCheck:
    """Compare the engine's log-probs of the fixed sequences after weight sync number ``sync``
    with the learner's (in its forward dtype) and the float32 reference's; rows must line up
    token for token."""
    shapes = [[len(r) for r in rows] for rows in (engine, learner, reference)]
    if not shapes[0] == shapes[1] == shapes[2]:
        raise PrecisionConfigError(
            f"sync check: the engine, learner and reference log-probs have different token "
            f"layouts (row lengths {shapes[0]}, {shapes[1]}, {shapes[2]}); score the same "
            f"sequences on each side."
        )
    e, lrn, ref = _flat(engine, "engine"), _flat(learner, "learner"), _flat(reference, "reference")
    if not ref:
        raise PrecisionConfigError("sync check: no token was scored; give non-empty sequences.")
    engine_gap = sum(abs(a - b) for a, b in zip(e, ref, strict=True)) / len(ref)
    rounding_gap = sum(abs(a - b) for a, b in zip(lrn, ref, strict=True)) / len(ref)
    ratio = engine_gap / max(rounding_gap, FLOOR)
    return SyncCheck(sync, engine_gap, rounding_gap, ratio, ratio > FACTOR, len(ref))
