"""Tests that catch what they claim to: one focused test per one-line bug of issue 52 that the
earlier tests let through. ``scripts/plant_mutants.py`` plants each bug in a scratch copy of the
package and checks that the test named beside it fails (``MUTANTS`` there names these tests).

Each test pins what a user would see if the bug came back, on inputs chosen so that the correct
line and the planted one disagree.
"""

from __future__ import annotations

import logging
import math
import random
from statistics import NormalDist
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from precision_plugin._core.canary import CanaryMonitor, canary_band
from precision_plugin._core.canary.ladder import certify_batch_invariance
from precision_plugin._core.scoring import TokenSequence

# -- 1. the band's quantile is its stated level, 1 - alpha (not 1 - alpha/2) --------------------


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_the_band_is_the_one_sided_1_minus_alpha_bound_it_states(alpha: float) -> None:
    # 400 tokens on an even grid of (0, 1): the bootstrap mean is normal to within 1e-4 here
    # (no skew), with sd sqrt(var / n). upper = floor + sqrt(2) (q - floor), so q is read back
    # from the band and must be the 1 - alpha quantile; the 1 - alpha/2 one lies 0.3 (alpha
    # 0.05) to 0.25 (alpha 0.01) sd higher, 14 and 6 times the bootstrap's own error.
    n = 400
    values = [(i + 0.5) / n for i in range(n)]
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n / n)
    band = canary_band(values, alpha=alpha)
    q = band.floor + (band.upper - band.floor) / math.sqrt(2.0)
    stated = mean + NormalDist().inv_cdf(1 - alpha) * sd
    wider = mean + NormalDist().inv_cdf(1 - alpha / 2) * sd
    assert band.floor == pytest.approx(mean, rel=1e-12)
    assert abs(q - stated) < 0.25 * (wider - stated), (q, stated, wider)


# -- 2. a frozen rollout is stale since its FIRST equal check -----------------------------------


def _logps(rng: random.Random) -> list[list[float]]:
    return [[rng.gauss(-2.0, 1.0) for _ in range(8)] for _ in range(16)]


def _noisy(rows: list[list[float]], rng: random.Random, scale: float) -> list[list[float]]:
    return [[x + rng.gauss(0.0, scale) for x in row] for row in rows]


def test_a_rollout_frozen_at_step_5_is_stale_since_5_at_every_later_check() -> None:
    # The rollout engine stops taking weights at step 5 with log-probs that match no learner
    # check (its state is broken too): only "bit-identical since" can name the freeze, and it
    # must name the first equal check at every later check, not the latest one.
    rng = random.Random(11)
    learner = _logps(rng)
    monitor = CanaryMonitor()
    frozen = None
    for step in range(0, 25, 5):
        if step == 0:
            rollout = _noisy(learner, rng, 1e-3)
        else:
            frozen = frozen or _noisy(learner, rng, 5e-2)
            rollout = frozen
        monitor.check(step, learner, rollout)
        learner = _noisy(learner, rng, 1e-2)
    later = [(c.step, c.verdict, c.stale_since) for c in monitor.checks[2:]]
    assert later == [(s, "weights_out_of_sync", 5) for s in (10, 15, 20)]
    assert monitor.alarm is not None and monitor.alarm.step == 10


# -- 3. the ladder's per-batch seed: batch k's row i samples with seed + k*N + i ----------------


def _draw(prompt: list[int], seed: int, n: int) -> SimpleNamespace:
    rng = random.Random(f"{prompt}/{seed}")
    ids = [rng.randrange(3, 64) for _ in range(n)]
    return SimpleNamespace(completion_ids=ids, logprobs=[-rng.random() for _ in ids])


def _batch_invariant_generate(prompts: list[list[int]], max_new: int, seed: int) -> list[Any]:
    """``HFRolloutEngine.generate``'s contract with no batch effect: row i uses seed + i."""
    return [_draw(p, seed + i, max_new) for i, p in enumerate(prompts)]


class _RowScorer:
    """A batch-invariant scorer: each sequence's log-probs depend on its tokens only."""

    name = "row-scorer"

    def score(self, sequences: list[TokenSequence]) -> list[list[float]]:
        return [
            [
                -((hash((s.prompt_ids, t, j)) % 1000) / 1000.0)
                for j, t in enumerate(s.completion_ids)
            ]
            for s in sequences
        ]


def test_a_batch_invariant_engine_with_more_prompts_than_one_batch_is_certified() -> None:
    canary = [TokenSequence((3 + i, 4 + i), (5 + i, 6 + i, 7 + i)) for i in range(7)]
    invariance = certify_batch_invariance(
        _RowScorer(), canary, 3, generate=_batch_invariant_generate, seed=4
    )
    assert invariance.same_tokens is True
    assert invariance.certified, invariance.summary()


# -- 4. the misfit check tests the longest THIRD ----------------------------------------------


def test_the_misfit_check_takes_the_longest_third() -> None:
    from precision_plugin._core.misfit import check_growth

    rng = random.Random(5)
    lengths = [10] * 8 + [100] * 4
    sums = [rng.gauss(0.0, math.sqrt(n)) for n in lengths]
    check = check_growth(sums, lengths)
    assert check.status in ("ok", "misfit")
    assert (check.long_sequences, check.long_min_length) == (4, 100), check
    assert "the 4 longest sequences (≥ 100 tokens)" in check.message


# -- 5. DeepSpeed's replaced loss_scale_window names the policy key that writes it ----------------


def test_a_replaced_loss_scale_window_names_loss_scaler_growth_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from precision_plugin.deepspeed import apply_config

    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        out = apply_config({"fp16": {"enabled": True, "loss_scale_window": 123}}, "float16")
    assert out["fp16"]["loss_scale_window"] != 123
    (line,) = [r.getMessage() for r in caplog.records if "loss_scale_window" in r.getMessage()]
    assert "(loss_scaler.growth_interval)" in line and "growth_factor" not in line, line


# -- 6. a master copy is float32 in ALL its tensors ---------------------------------------------


def test_a_master_copy_partly_in_half_precision_is_no_float32_master_copy() -> None:
    from precision_plugin._core.master_copy import fp32_master_copy

    mixed = [torch.zeros(2, dtype=torch.float32), torch.zeros(2, dtype=torch.float16)]
    trainer = SimpleNamespace(optimizer=SimpleNamespace(fp32_groups=mixed))
    assert fp32_master_copy(trainer) is None
    whole = SimpleNamespace(optimizer=SimpleNamespace(fp32_groups=[torch.zeros(2)] * 2))
    assert fp32_master_copy(whole) == (
        "DeepSpeed FP16_UnfusedOptimizer (SimpleNamespace.fp32_groups, float32)"
    )


# -- 7. an AReaL (OmegaConf structured) switch of -1 is on ----------------------------------------


@pytest.mark.parametrize(
    ("raw", "on"), [(-1, True), ("-1", True), (2, True), (0, False), ("0", False)]
)
def test_an_areal_switch_reads_any_nonzero_integer_as_on(raw: Any, on: bool) -> None:
    # OmegaConf's BooleanNode: int(value) != 0 (so -1 is true, as bool(-1) is in Python).
    from precision_plugin._core.configs import AREAL

    read = AREAL.read_mapping({"sglang": {"enable_deterministic_inference": raw}}, "cfg.yaml")
    assert read["sglang.enable_deterministic_inference"] is on
