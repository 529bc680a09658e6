"""Exact pins of the statistics and decision logic that the behavioural tests leave loose.

Each test pins a value worked out independently (by hand, with ``fractions``, or with the
documented formula written out here), so that a one-line slip in the code (a comparison, an
off-by-one, a dropped term) changes a result some test asserts. Found by a mutation pass: every
test here failed on a planted bug that the rest of the suite let through.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
from rich.console import Console
from scipy import stats

from precision_plugin._core.decision import (
    MAX_NUM_PROMPTS,
    Attribution,
    Evidence,
    Headroom,
    apply_forms,
    decide,
    percent,
    prompts_to_decide,
)
from precision_plugin._core.intervals import (
    batch_ess,
    excess_kurtosis,
    expected_batch_ess,
    mixed_batch_ess,
    ratio_interval,
    variance_normal,
)
from precision_plugin._core.metrics.consequence import (
    SEQUENCE_MASKS,
    Consequence,
    Interval,
    Projection,
)
from precision_plugin._core.metrics.mismatch import compute_mismatch, verdict
from precision_plugin.probe.advice import (
    BucketConsequence,
    DtypeConsequence,
    classify,
    dtype_consequence,
    dtype_line,
    ess_text,
)
from precision_plugin.probe.length import bucket_slices, fit_slope, length_effect
from precision_plugin.probe.table import render_probe_table


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def _ess_monte_carlo(means: list[float], sds: list[float], law: str = "normal") -> float:
    """The documented expected-ESS estimator written out in linear space: 250,000 weights per
    evaluation (replicates × batch), replicates clipped to [64, 2000], seed 0, each replicate's
    ``(Σ w)² / (N Σ w²)`` at most 1 (scale-free: each row is divided by its largest weight),
    then their mean. ``law="t3"``: the standardised draws are
    a Student t with 3 degrees of freedom divided by √3 (unit variance)."""
    n = len(means)
    reps = min(2000, max(64, 250_000 // n))
    rng = np.random.default_rng(0)
    z = rng.standard_normal((reps, n)) if law == "normal" else rng.standard_t(3, (reps, n)) / 3**0.5
    x = np.asarray(means) + np.asarray(sds) * z
    w = np.exp(x - x.max(axis=1, keepdims=True))  # each row scaled by its largest: no overflow
    ess = w.sum(axis=1) ** 2 / (n * (w**2).sum(axis=1))
    return float(np.minimum(ess, 1.0).mean())


def _tail_high(variance: float, residuals: list[float]) -> float:
    """The high end of a 90 % chi-square interval on ``variance`` with the degrees of freedom
    of a sample of ``n`` at an excess kurtosis of at least 8 (``2/(2/(n-1) + k/n)``), ``k``
    the residuals' bias-corrected G2 (scipy's)."""
    n = len(residuals)
    k = max(float(stats.kurtosis(residuals, fisher=True, bias=False)), 8.0)
    dof = 2.0 / (2.0 / (n - 1) + k / n)
    return variance * dof / stats.chi2.ppf(0.05, dof)


# intervals.py ------------------------------------------------------------------------------


def test_variance_normal_has_an_interval_from_two_values():
    """Two values give one degree of freedom and an interval (catches ``n >= 3`` for ``n >= 2``)."""
    low, high = variance_normal(0.5, 2)
    assert _close(low, 0.5 * 1 / stats.chi2.ppf(0.95, 1))
    assert _close(high, 0.5 * 1 / stats.chi2.ppf(0.05, 1))
    assert all(math.isnan(v) for v in variance_normal(0.5, 1))


def test_excess_kurtosis_is_the_bias_corrected_g2_from_four_values():
    """``G2`` of ``[0, 0, 0, 1]`` by hand is 4 (catches a biased ``g2`` = −2/3, and refusing
    four values: ``size < 5``)."""
    xs = [Fraction(v) for v in (0, 0, 0, 1)]
    n = len(xs)
    mean = sum(xs) / n
    m2 = sum((x - mean) ** 2 for x in xs) / n
    m4 = sum((x - mean) ** 4 for x in xs) / n
    g2 = m4 / m2**2 - 3
    big_g2 = ((n + 1) * g2 + 6) * (n - 1) / ((n - 2) * (n - 3))
    assert big_g2 == 4
    assert _close(excess_kurtosis([0.0, 0.0, 0.0, 1.0]), 4.0)
    assert math.isnan(excess_kurtosis([0.0, 0.0, 1.0]))


def test_an_ess_never_rounds_above_one():
    """Equal weights give an ESS of exactly 1, never 1 + ulp (catches a cap above 1 on the
    log-space ``exp(log ESS)``, which rounds to 1.0000000000000002 for 3 equal weights)."""
    assert batch_ess(0.0, 10, 3, drift=0.03) == 1.0
    assert expected_batch_ess([0.3] * 5, [0.0] * 5) == 1.0
    assert expected_batch_ess([0.3] * 7, [0.0] * 7) == 1.0


def test_the_expected_ess_uses_the_documented_number_of_replicates():
    """A batch of 1,000 draws 250,000 // 1,000 = 250 replicates of seed 0 (catches another
    replicate count); the figure equals the estimator written out in linear space."""
    sd = math.sqrt(0.04 * 10)
    assert _close(batch_ess(0.04, 10, 1000), _ess_monte_carlo([0.0] * 1000, [sd] * 1000))
    assert _close(batch_ess(0.04, 10, 4), _ess_monte_carlo([0.0] * 4, [sd] * 4))


def test_a_mixed_batch_spreads_each_sequence_by_the_root_of_its_length():
    """``sd_i = √(variance·L_i)``: lengths 4, 4, 1 at variance 0.25 give sds 1, 1, 0.5 (catches
    ``√variance·L_i``)."""
    got = mixed_batch_ess(0.25, 0.0, [4, 4, 1])
    assert _close(got, _ess_monte_carlo([0.0, 0.0, 0.0], [1.0, 1.0, 0.5]))


def test_a_mixed_batch_without_spread_weighs_by_the_drift_alone():
    """Variance 0 is a valid walk: lengths 1 and 3 at a drift of ln 2 give weights 2 and 8, an
    ESS of 10² / (2·(4 + 64)) = 25/34 (catches refusing a zero variance and dropping the
    per-sequence drift ``drift·L_i``)."""
    assert _close(mixed_batch_ess(0.0, math.log(2.0), [1, 3]), 25 / 34)


def test_the_ratio_interval_of_two_clusters_by_hand():
    """``a = [1, 3]``, ``b = [2, 2]``: r = 1, residuals a − r·b = ∓1, se = √(2/1·2)/4 = 0.5
    (catches refusing two clusters, dropping ``n/(n − 1)``, and ``a − r`` for ``a − r·b``)."""
    z = NormalDist().inv_cdf(0.95)
    r, low, high = ratio_interval([1.0, 3.0], [2.0, 2.0])
    assert r == 1.0
    assert _close(low, 1.0 - 0.5 * z)
    assert _close(high, 1.0 + 0.5 * z)


def test_the_ratio_interval_is_floored_at_zero():
    """``a = [0, 2]``, ``b = [1, 1]``: r = 1, se = √(2·2)/2 = 1, so r − 1.645·se < 0 and the low
    end is 0 (a k3 KL is never negative; catches the missing floor)."""
    z = NormalDist().inv_cdf(0.95)
    r, low, high = ratio_interval([0.0, 2.0], [1.0, 1.0])
    assert (r, low) == (1.0, 0.0)
    assert _close(high, 1.0 + z)


# probe/length.py ---------------------------------------------------------------------------


def test_the_slope_of_equal_lengths_is_undefined_not_an_error():
    """Three sequences of one length have no slope: NaN, NaN (catches ``sxx < 0``, which
    divides by zero)."""
    slope, se = fit_slope([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    assert math.isnan(slope) and math.isnan(se)


def test_two_points_give_a_slope_without_a_standard_error():
    """Two points: slope (3 − 1)/(2 − 1) = 2, no residual degree of freedom, so the error is NaN
    (catches ``n < 2`` for ``n < 3``, which divides by ``n − 2 = 0``)."""
    slope, se = fit_slope([1.0, 2.0], [1.0, 3.0])
    assert slope == 2.0 and math.isnan(se)


def test_buckets_are_capped_at_eight_and_floored_at_one():
    """40 sequences: 40 // 4 = 10 buckets, capped at ``MAX_BUCKETS`` = 8 of 5 each (catches a cap
    of 9); 3 sequences: 3 // 4 = 0, floored at one bucket of all 3 (catches a floor of 2)."""
    assert bucket_slices(40) == [(5 * b, 5 * b + 5) for b in range(8)]
    assert bucket_slices(3) == [(0, 3)]
    assert bucket_slices(0) == []


def test_more_buckets_asked_than_sequences_gives_one_per_sequence():
    """``num_buckets`` 5 over 3 sequences: 3 buckets of one, never an empty bucket (catches the
    missing ``min(k, n)``)."""
    assert bucket_slices(3, 5) == [(0, 1), (1, 2), (2, 3)]


def test_uneven_buckets_spread_the_remainder():
    """11 sequences in 3 buckets: bounds ⌊11·b/3⌋ = 0, 3, 7, 11 (catches equal widths ⌊11/3⌋ with
    the remainder dumped in the last: 0, 3, 6, 11)."""
    assert bucket_slices(11, 3) == [(0, 3), (3, 7), (7, 11)]
    assert [11 * b // 3 for b in range(4)] == [0, 3, 7, 11]


def test_a_nan_on_the_rollout_side_is_left_out_of_the_length():
    """Only tokens finite on both sides count: a NaN rollout log-prob drops that token (catches
    testing the trainer's value alone, which lets the NaN into the sum)."""
    nan = math.nan
    effect = length_effect([[-1.0, -2.0, -0.5]], [[-1.5, nan, -1.0]])
    (bucket,) = effect.buckets
    assert (bucket.tokens, bucket.mean_log_ratio) == (2, 1.0)  # 0.5 + 0.5
    assert effect.drift_per_1k == 500.0


def test_equal_lengths_keep_their_input_order_and_the_mean_length_is_a_true_mean():
    """Lengths 1, 2, 2, 3 in two buckets: the two of length 2 stay in input order (the buckets
    of ``advice.dtype_consequence`` sort the same way), so the buckets are {A, B} and {C, D}
    with mean log-ratios (0.5 − 0.5)/2 = 0 and (1 + 0.75)/2 = 0.875 (catches another tie order);
    the first bucket's mean length is 3/2 = 1.5 (catches floor division)."""
    d = [[0.5], [-0.25, -0.25], [0.5, 0.5], [0.25, 0.25, 0.25]]  # A, B, C, D
    rollout = [[-1.0] * len(v) for v in d]
    train = [[-1.0 + x for x in v] for v in d]
    first, second = length_effect(train, rollout, num_buckets=2).buckets
    assert (first.mean_log_ratio, second.mean_log_ratio) == (0.0, 0.875)
    assert (first.mean_length, second.mean_length) == (1.5, 2.5)


# decision.py -------------------------------------------------------------------------------


def _ev(dtype, kept, k3=(1e-5, 0.9e-5, 1.1e-5), n=16, verdict="noticeable", blocked=""):
    return Evidence(dtype, Interval(*kept), Interval(*k3), n, verdict, blocked)


def test_percent_at_its_boundaries():
    """Zero is ``0%``; 0.001 is the first ``0.1%``; 0.1 is the first whole percent; from 0.995
    to 0.999 one decimal again, so nothing short of 1 reads ``100%``; above 0.999 (and below 1)
    is ``>99.9%``; a negative share keeps its sign (catches each boundary moved by one
    comparison)."""
    assert percent(0) == "0%" and percent(0.0) == "0%"
    assert percent(0.000999) == "<0.1%" and percent(0.001) == "0.1%"
    assert percent(0.05) == "5.0%" and percent(0.1) == "10%"
    assert percent(0.9949) == "99%" and percent(0.995) == "99.5%" and percent(0.996) == "99.6%"
    assert percent(0.999) == "99.9%" and percent(0.9995) == ">99.9%" and percent(1.0) == "100%"
    assert percent(1.2) == "120%" and percent(-0.05) == "-5.0%" and percent(-0.12) == "-12%"


def test_a_setting_with_as_large_a_share_as_the_dtype_dominates():
    """A tie goes to the setting (``share >= own``, not ``>``); a NaN dtype share counts as 0 (not
    1); a negative dtype share is shown as 0 % in the clause."""
    tie = Attribution("float16", "kv_cache", 0.5, "kv_cache_dtype", {}, 0.5)
    assert tie.dominates
    unknown = Attribution("float16", "kv_cache", 0.3, "kv_cache_dtype", {}, math.nan)
    assert unknown.dominates
    negative = Attribution("float16", "kv_cache", 0.8, "kv_cache_dtype", {"vLLM": "x"}, -0.01)
    assert negative.clause() == (
        "change kv_cache_dtype first (80% of the float16 mismatch in this rollout, the dtype's "
        "own rounding 0%): vLLM x"
    )


def test_prompts_to_decide_uses_the_facing_half_widths_and_rounds_up():
    """Upper (0.75, 0.25, 0.875), lower (0.5, 0.375, 1.0): facing half-widths 0.5 + 0.5 over a
    gap of 0.25, so 16·4²·1.1 = 281.6 → 282 (catches the outer half-widths, 0.125 + 0.125);
    13 sequences at a ratio of 2: 13·4·1.1 = 57.2 → 58 (catches rounding to nearest)."""
    a, b = (0.75, 0.25, 0.875), (0.5, 0.375, 1.0)
    assert prompts_to_decide(a, b, 16) == prompts_to_decide(b, a, 16) == 282
    assert math.ceil(Fraction(16) * 4**2 * Fraction(11, 10)) == 282
    c, d = (0.75, 0.5, 1.0), (0.5, 0.25, 0.75)
    assert prompts_to_decide(c, d, 13) == math.ceil(Fraction(13 * 4 * 11, 10)) == 58


def test_prompts_to_decide_allows_exactly_the_maximum():
    """90,909 · 1² · 1.1 = 99,999.9 → 100,000 = ``MAX_NUM_PROMPTS``: still given (catches
    ``<``); one more sequence needs 100,001: ``None``."""
    c, d = (0.75, 0.625, 1.0), (0.5, 0.25, 0.625)  # facing 0.125 + 0.125 over 0.25: ratio 1
    assert prompts_to_decide(c, d, 90_909) == MAX_NUM_PROMPTS == 100_000
    assert prompts_to_decide(c, d, 90_910) is None


HEADROOM = Headroom("keep_fp32_modules", ("model.layers.3.mlp",), 5, 3.0, "5 module(s) ...")


def test_keep_fp32_modules_travels_with_float16_only():
    """Headroom's ``keep_fp32_modules`` is a float16 remedy: a decision for bfloat16 carries none
    (catches attaching it to any dtype)."""
    fp16, bf16 = _ev("float16", (0.3, 0.2, 0.4)), _ev("bfloat16", (0.7, 0.6, 0.8))
    d = decide({"float16": fp16, "bfloat16": bf16}, target=4096, batch=256, headroom=HEADROOM)
    assert (d.action, d.dtype, d.decided_by) == ("train", "bfloat16", "consequence")
    assert d.keep_fp32_modules == () and "headroom:" not in d.line
    assert d.forms == apply_forms("bfloat16")


def test_a_costly_dtype_is_told_to_shorten_or_correct():
    """A chosen dtype whose verdict is ``costly`` (kept 0.3-0.5) gets the "still loses more than
    half" reason, as a ``severe`` one does (catches dropping ``costly``)."""
    d = decide({"float16": _ev("float16", (0.4, 0.3, 0.5), verdict="costly")}, target=8, batch=4)
    assert d.reasons == (
        "float16 still loses more than half: generate shorter, or train with a correction "
        "(verl's Seq-MIS, TRL's sequence_mask) and watch its masked share",
    )


def test_only_a_bfloat16_rounding_attribution_agrees_with_float16():
    """The attribution "agrees" with float16 when it shows bfloat16's mismatch is its rounding;
    float16's own rounding attribution says nothing about switching (catches dropping the
    ``change.dtype == "bfloat16"`` condition)."""
    fp16, bf16 = _ev("float16", (0.7, 0.6, 0.8)), _ev("bfloat16", (0.3, 0.2, 0.4))
    own = Attribution("float16", "dtype", 0.9, "dtype", {}, 0.9)
    d = decide({"float16": fp16, "bfloat16": bf16}, target=4096, batch=256, attribution=own)
    assert d.dtype == "float16" and d.reasons == () and "agrees" not in d.line


def test_the_engine_note_follows_a_refusal_not_a_blocked_float16():
    """float16 blocked by its own measurement stays out for that reason; the "only with a rollout
    engine that runs it" note belongs to an engine's refusal alone (catches adding it whenever
    float16 is out and a refusal was passed)."""
    fp16 = _ev("float16", (0.7, 0.6, 0.8), blocked="'mlp' reaches 7e+04")
    bf16 = _ev("bfloat16", (0.3, 0.2, 0.4))
    d = decide({"float16": fp16, "bfloat16": bf16}, target=64, batch=8, refused="vLLM refuses")
    assert d.reasons == ("float16 is out: 'mlp' reaches 7e+04",)


def test_either_dtype_works_needs_both_lower_ends_negligible():
    """One dtype negligible, the other not: the consequence decides for the negligible one, not
    "either" (catches ``max`` of the lower ends for ``min``)."""
    fp16 = _ev("float16", (0.5, 0.3, 0.7), k3=(1e-5, 0.9e-5, 1.1e-5))
    bf16 = _ev("bfloat16", (0.999, 0.995, 1.0), k3=(4e-5, 3.5e-5, 4.5e-5), verdict="negligible")
    d = decide({"float16": fp16, "bfloat16": bf16}, target=512, batch=64)
    assert (d.action, d.dtype, d.decided_by) == ("train", "bfloat16", "consequence")


def test_either_dtype_names_the_lower_central_k3():
    """Both negligible: the dtype named is the one with the lower central k3 (2e-5 < 3e-5), not
    the lower interval end (catches ``k3[1]`` for ``k3[0]``)."""
    negligible = (0.995, 0.99, 1.0)
    fp16 = _ev("float16", negligible, k3=(2e-5, 1.5e-5, 2.5e-5), verdict="negligible")
    bf16 = _ev("bfloat16", negligible, k3=(3e-5, 1e-5, 5e-5), verdict="negligible")
    d = decide({"float16": fp16, "bfloat16": bf16}, target=512, batch=64)
    assert (d.action, d.dtype) == ("either", "float16")


def test_prompts_to_decide_counts_from_the_smaller_sample():
    """16 and 64 sequences: the estimate scales the smaller, 16 → 282 (catches ``max``: 1,127)."""
    a = _ev("float16", (0.75, 0.25, 0.875), n=16)
    b = _ev("bfloat16", (0.5, 0.375, 1.0), n=64)
    d = decide({"float16": a, "bfloat16": b}, target=4096, batch=256)
    assert d.num_prompts == 282


# metrics/mismatch.py (``precision_plugin._core.metrics.mismatch``) ----------------------------------------


def test_a_fully_masked_row_is_no_sequence():
    """A row whose tokens are all masked out is not a sequence: 1 sequence of 2 tokens with
    log-ratio 0.5 + 0.5 = 1 (catches counting every row, and keeping the empty row's length 0
    and sum 0 in the per-sequence lists)."""
    train = [[-1.0, -2.0], [-1.0, -1.0]]
    rollout = [[-1.5, -2.5], [-0.5, -0.5]]
    m = compute_mismatch(train, rollout, [[1, 1], [0, 0]])
    assert (m.tokens, m.sequences) == (2, 1)
    assert (m.seq_lengths, m.seq_log_ratio) == ([2], [1.0])
    assert m.seq_kl == -1.0 and m.drift_per_1k == 500.0


def test_the_sequence_kl_of_no_sequence_is_nan():
    """No sequence, no estimate: ``seq_kl`` is NaN, not 0 (a 0 would read as "no mismatch")."""
    m = compute_mismatch([[-1.0, -2.0]], [[-1.5, -2.5]], [[0, 0]])
    assert m.sequences == 0 and math.isnan(m.seq_kl)


def test_the_verdict_thresholds_are_strict_below_ok_and_inclusive_up_to_bad():
    """``prob_diff_mean`` 0.5 − 0.25 = 0.25 exactly: at the ok threshold it is "watch" (``<``,
    catches ``<=``); at the bad threshold it is still "watch" (``<=``, catches ``<``)."""
    m = compute_mismatch([math.log(0.5)], [math.log(0.25)])
    assert m.prob_diff_mean == 0.25
    assert verdict(m, {"prob_diff_ok": 0.25, "prob_diff_bad": 0.5})[0] == "watch"
    assert verdict(m, {"prob_diff_ok": 0.125, "prob_diff_bad": 0.25})[0] == "watch"
    assert verdict(m, {"prob_diff_ok": 0.125, "prob_diff_bad": 0.2})[0] == "problem"
    assert verdict(m, {"prob_diff_ok": 0.3, "prob_diff_bad": 0.5})[0] == "ok"


# probe/table.py ----------------------------------------------------------------------------


def _table_text(results: dict, consequence: dict | None = None) -> str:
    """The probe table of a minimal results file (the JSON form the docs render), with its
    legend (--explain)."""
    data = {
        "model": "m",
        "engine": "hf",
        "device": "cpu",
        "settings": {"max_new_tokens": 64},
        "self_check": {"message": "float32 paths agree."},
        "results": results,
        "consequence": consequence,
    }
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_probe_table(data, explain=True))
    return console.export_text()


def _cells(text: str, first: str) -> list[str]:
    return next(ln.split() for ln in text.splitlines() if ln.strip().startswith(first + " "))


def test_the_k3_factor_is_over_float16_when_measured_else_the_lowest_low_precision_dtype():
    """float16 measured: it is the reference even when bfloat16's k3 is lower (1e-5 / 5e-5 =
    0.2x; catches "the lowest" always). Without float16: bfloat16, never the float32 self-check
    (catches dropping the self-check exclusion: fp32, 10000x). Without a positive k3: float16,
    and the factor over a k3 of 0 is n/a (catches ``>= 0`` admitting a zero reference, and
    ``b < 0`` dividing by it)."""
    text = _table_text(
        {"float32": {"k3_kl": 1e-9}, "float16": {"k3_kl": 5e-5}, "bfloat16": {"k3_kl": 1e-5}}
    )
    assert _cells(text, "dtype")[3] == "fp16"
    assert _cells(text, "float16")[2] == "1.0x" and _cells(text, "bfloat16")[2] == "0.2x"
    text = _table_text({"float32": {"k3_kl": 1e-9}, "bfloat16": {"k3_kl": 1e-5}})
    assert _cells(text, "dtype")[3] == "bf16" and _cells(text, "bfloat16")[2] == "1.0x"
    text = _table_text({"float32": {"k3_kl": 1e-9}, "bfloat16": {"k3_kl": 0.0}})
    assert _cells(text, "dtype")[3] == "fp16" and _cells(text, "bfloat16")[2] == "n/a"
    text = _table_text({"float16": {"k3_kl": 0.0}, "bfloat16": {"k3_kl": 0.0}})
    assert _cells(text, "float16")[2] == "n/a" and _cells(text, "bfloat16")[2] == "n/a"


def test_a_factor_of_exactly_ten_is_whole():
    """k3 10·2⁻²⁰ over 2⁻²⁰ is exactly 10: ``10x``, not ``10.0x`` (catches ``> 10``)."""
    text = _table_text({"float16": {"k3_kl": 2.0**-20}, "bfloat16": {"k3_kl": 10 * 2.0**-20}})
    assert _cells(text, "bfloat16")[2] == "10x"


def test_the_row_cells_of_a_results_file():
    """Sequences with a thousands separator (1,234), the ESS to two decimals (0.50), the
    consequence's verdict before the mismatch's (float32: ``floor``, not ``ok``), and ``-`` for
    the kept share of a dtype without a verdict (not ``n/a``)."""
    measured = {"sequences": 1234, "ess": 0.5}
    consequence = {
        "target_length": 512,
        "batch_size": 64,
        "dtypes": {"float32": {"verdict": "floor", "measured": measured}},
    }
    results = {"float32": {"k3_kl": 1e-9, "verdict": "ok"}, "bfloat16": {"k3_kl": 1e-5}}
    text = _table_text(results, consequence)
    assert _cells(text, "float32")[5:] == ["1,234", "0.50", "n/a·n/a", "n/a", "floor"]
    assert _cells(text, "bfloat16")[-1] == "-"


def test_a_results_file_without_a_consequence_still_has_a_caption():
    """No consequence lines: the caption starts with the self-check's message, and names the
    masks' default bounds ``w ≤ 3`` and ``0.5 ≤ w ≤ 2`` (catches a dropped message and a changed
    default)."""
    text = " ".join(_table_text({"float32": {"k3_kl": 1e-9}}).split())
    assert "* self-check: float32 paths agree." in text
    assert "TRL's default sequence_mask (w ≤ 3) and verl's Seq-MIS preset (0.5 ≤ w ≤ 2)" in text


# probe/advice.py ---------------------------------------------------------------------------


@functools.cache
def _measured() -> DtypeConsequence:
    """A real dtype consequence (4 short sequences, a batch of 4) whose projection the tests
    below replace with hand-set intervals."""
    lengths = (8, 16, 24, 32)
    rollout = [[-1.0] * n for n in lengths]
    train = [[-1.0 + 0.01 * ((i % 3) - 1) for i in range(n)] for n in lengths]
    return dtype_consequence("float16", train, rollout, 64, batch_size=4)


def _projected(ess: Interval, trl: Interval, verl: Interval, clip: Interval) -> DtypeConsequence:
    """``_measured()`` with this projection at 64 tokens and no batch ESS (so ``ess`` is the
    projection's)."""
    projection = Projection(64, ess, trl, verl, clip)
    return dataclasses.replace(_measured(), projection=projection, batch_ess={})


NO_SHARE = Interval(0.0, 0.0, 0.0)
SEQUENCE_MASKS_BY_KEY = {m.key: m for m in SEQUENCE_MASKS}


def test_the_kept_interval_takes_each_masks_opposite_end():
    """kept = min(ESS, 1 − mask): ESS (0.875, 0.75, 0.9375), TRL mask (0.25, 0.125, 0.375), verl
    (0.0625, 0, 0.125) keep 0.75 with low min(0.75, 1 − 0.375, 1 − 0.125) = 0.625 and high
    min(0.9375, 1 − 0.125, 1 − 0) = 0.875 (catches taking a mask's same-side end)."""
    c = _projected(
        Interval(0.875, 0.75, 0.9375),
        Interval(0.25, 0.125, 0.375),
        Interval(0.0625, 0.0, 0.125),
        NO_SHARE,
    )
    kept = c.kept_interval
    assert (kept.value, kept.low, kept.high) == (0.75, 0.625, 0.875)


def test_the_verdict_thresholds_are_inclusive():
    """Kept exactly 0.99 with exactly 1 % of tokens clipped is negligible (catches ``kept >``
    and ``clip >=``); more clipped is noticeable however much is kept (catches ignoring the
    clip); exactly 0.5 is noticeable and exactly 0.3 costly (catches ``>`` for ``>=``)."""

    def verdict_at(kept: float, clip: float = 0.0) -> str:
        ess = Interval(kept, kept, kept)
        return classify(_projected(ess, NO_SHARE, NO_SHARE, Interval(clip, clip, clip)))

    assert 1.0 - 0.01 == 0.99
    assert verdict_at(0.99, 0.01) == "negligible"
    assert verdict_at(1.0, 0.5) == "noticeable"
    assert verdict_at(0.5) == "noticeable" and verdict_at(0.3) == "costly"
    assert verdict_at(0.2999) == "severe"


def test_ess_text_at_its_bounds():
    """0 is ``0.00`` (it reaches 0; catches ``0 <=``); 0.995 is ``>0.99`` (it would round to
    1.00 in decimal but is below 1; catches ``0.995 <``); 1 is ``1.00``."""
    assert ess_text(0.0) == "0.00" and ess_text(0.004) == "<0.01"
    assert ess_text(0.995) == ">0.99" and ess_text(1.0) == "1.00"


def test_share_intervals_count_what_the_share_was_made_of():
    """29 of 100 sequences masked is the share 0.29, and 0.29·100 = 28.999999999999996: the
    interval is Clopper-Pearson's for k = 29 (``beta.ppf(0.05, 29, 72)``, ``beta.ppf(0.95, 30,
    71)``), for the mask and for the clip (catches truncating to 28)."""
    share = 29 / 100
    assert share * 100 != 29
    measured = Consequence(0.5, share, 0.0, share, 100, 100)
    bucket = BucketConsequence(1, 1, 1.0, measured, 0.0)
    low, high = stats.beta.ppf(0.05, 29, 72), stats.beta.ppf(0.95, 30, 71)
    for name in ("seq_mask_fraction_trl", "tis_clip_fraction"):
        iv = bucket.to_dict()["intervals"][name]
        assert (iv["value"], iv["n"]) == (share, 100)
        assert _close(iv["low"], low) and _close(iv["high"], high)


def test_the_batch_ess_is_given_for_the_asked_batch_size_too():
    """A batch of 4 is reported next to 64, 256 and 1,024 (catches dropping ``batch_size``,
    which leaves ``ess`` on the infinite-batch value)."""
    c = _measured()
    assert sorted(c.batch_ess) == [4, 64, 256, 1024]
    assert c.ess is c.batch_ess[4]


def _walks(lengths: list[int], eps_of) -> tuple[list[list[float]], list[list[float]]]:
    """Log-probs whose per-token difference is Gaussian of size ``eps_of(length)`` (seed 3)."""
    rng = np.random.default_rng(3)
    train, rollout = [], []
    for n in lengths:
        t = (-1.0 - rng.random(n)).tolist()
        d = (eps_of(n) * rng.standard_normal(n)).tolist()
        train.append(t)
        rollout.append([a - b for a, b in zip(t, d, strict=True)])
    return train, rollout


def test_ess_intervals_take_their_low_end_from_the_high_variance():
    """Long sequences that spread faster (a misfit): the projected batch ESS's low end is the
    smaller of the normal and Student-t-3 expected ESS at the larger of the widened high
    variance and the heavy-tail high end (a 90 % chi-square interval sized at an excess
    kurtosis of at least 8); the measured ESS's low end the same at the fit's own (unwidened)
    high ends, over the measured lengths, and its value the measured one (catches the low end
    from the central or the low variance, the normal law alone, and the measured interval
    taking the widened fit)."""
    lengths = [16 * (i + 1) for i in range(16)]
    train, rollout = _walks(lengths, lambda n: 0.01 if n < 192 else 0.08)
    c = dtype_consequence("bfloat16", train, rollout, 4096)
    assert c.growth.status == "misfit"
    pairs = zip(train, rollout, strict=True)
    sums = [math.fsum(a - b for a, b in zip(t, r, strict=True)) for t, r in pairs]
    k1 = math.fsum(sums) / sum(lengths)  # the residuals' centre: the mean log-ratio per token
    residuals = [(s - k1 * n) / math.sqrt(n) for s, n in zip(sums, lengths, strict=True)]
    drift, variance = c.fit.drift, c.fit.variance  # the fit's own (pinned above)
    tail_high = _tail_high(variance, residuals)
    assert math.isclose(c.fit.variance_tail_high, tail_high, rel_tol=1e-9)
    widened = c.growth.widened_high
    high = max(widened, tail_high)
    sd = math.sqrt(high * 4096)
    lows = [_ess_monte_carlo([drift * 4096] * 256, [sd] * 256, law) for law in ("normal", "t3")]
    assert lows[1] < lows[0]  # the t3 sums are the lower end here
    assert math.isclose(c.batch_ess[256].low, min(lows), rel_tol=1e-9)
    own_high = max(c.fit.variance_robust_high, tail_high)
    assert own_high < high or widened <= tail_high
    means = [drift * n for n in lengths]
    sds = [math.sqrt(own_high * n) for n in lengths]
    lows = [_ess_monte_carlo(means, sds, law) for law in ("normal", "t3")]
    assert math.isclose(c.measured_intervals["ess"].low, min(lows), rel_tol=1e-9)
    assert c.measured_intervals["ess"].value == c.measured.ess


def test_advice_buckets_keep_equal_lengths_in_input_order():
    """Lengths 1, 2 ×6, 3 in two buckets of four: the first bucket is the first four in input
    order, whose log-ratios are all 0, so its per-token variance is exactly 0 and its mean length
    7/4 (catches ordering ties by their sums, which moves the negative ones forward, and a floor
    division)."""
    d = [[0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]  # A, B, C, D
    d += [[-0.25, -0.25]] * 3 + [[0.25, 0.25, 0.25]]  # E, F, G, H
    rollout = [[-1.0] * len(v) for v in d]
    train = [[-1.0 + x for x in v] for v in d]
    first, second = dtype_consequence("float16", train, rollout, 64, batch_size=4).buckets
    assert (first.variance_per_token, first.mean_length) == (0.0, 1.75)
    assert second.variance_per_token > 0.0 and second.mean_length == 2.25


def test_the_line_names_the_mask_that_drops_more_first():
    """Masks are listed by their projected share, largest first, whichever is declared first
    (catches listing them in declaration order)."""
    trl, verl = SEQUENCE_MASKS_BY_KEY["trl"], SEQUENCE_MASKS_BY_KEY["verl"]
    small, large = Interval(0.25, 0.125, 0.375), Interval(0.5, 0.375, 0.625)
    for trl_share, verl_share, first in ((small, large, verl), (large, small, trl)):
        c = _projected(Interval(0.5, 0.25, 0.75), trl_share, verl_share, NO_SHARE)
        line = dtype_line(dataclasses.replace(c, verdict="noticeable"))
        other = trl if first is verl else verl
        assert line.index(f"{first.label} ({first.bounds}) drops") < line.index(
            f"{other.label} ({other.bounds}) drops"
        )


def test_a_huge_log_ratio_caps_its_k3_term_instead_of_overflowing():
    """One token with log π − log μ = 1000: its k3 term is expm1(700) − 1000, ``expm1``'s range
    capped at 700 (catches the uncapped ``expm1(1000)``, an ``OverflowError``)."""
    c = dtype_consequence("float16", [[-1.0]], [[-1001.0]], 64, batch_size=4)
    assert c.k3.value == math.expm1(700.0) - 1000.0


def test_the_verdict_line_carries_the_heavy_tail_warning_where_it_fires():
    """32 sequences of 10 tokens, log-ratio sums ±0.1 but one of 3: the residuals' excess
    kurtosis (scipy's bias-corrected G2, about 32) is above 8, and the line says "Heavy tails:
    the interval may be too narrow" with it; the JSON's tail block has the statistic, the
    threshold 8 and the warning. Without the outlier (G2 below 8) the line has no warning
    (catches a warning that never or always fires)."""

    def consequence(sums: list[float]) -> DtypeConsequence:
        rollout = [[-1.0] * 10 for _ in sums]
        train = [[-1.0 + s / 10] * 10 for s in sums]
        c = dtype_consequence("float16", train, rollout, 64, batch_size=4)
        c.verdict = classify(c)
        return c

    sums = [0.1 if i % 2 else -0.1 for i in range(31)] + [3.0]
    c = consequence(sums)
    k1 = math.fsum(sums) / 320
    g2 = float(stats.kurtosis([(s - k1 * 10) / 10**0.5 for s in sums], bias=False))
    assert g2 > 8 and math.isclose(c.fit.kurtosis, g2, rel_tol=1e-9)
    line = dtype_line(c)
    assert (
        f"Heavy tails: the interval may be too narrow (the sequence log-ratios' excess "
        f"kurtosis {g2:.1f} is above 8)." in line
    )
    tail = c.to_dict()["fit"]["tail"]
    assert (tail["threshold"], tail["warning"]) == (
        8.0,
        "heavy tails: the interval may be too narrow",
    )
    assert math.isclose(tail["value"], g2, rel_tol=1e-9)
    calm = consequence([0.1 * ((i % 5) - 2) for i in range(32)])
    assert calm.fit.kurtosis < 8 and "Heavy tails" not in dtype_line(calm)
    assert calm.to_dict()["fit"]["tail"]["warning"] == ""
