"""The consequence metrics: exact values on hand-built batches, log-space ESS, shards that add
up, the growth fit and its projection against independent formulas."""

from __future__ import annotations

import itertools
import math

import pytest
import scipy.stats
import torch

from precision_plugin._core.metrics.consequence import (
    COVERAGE,
    TRL_SEQUENCE_MASK,
    VERL_SEQUENCE_MASK,
    chi2_quantile,
    combine_log_moments,
    compute_consequence,
    consequence_from_sums,
    consequence_sums,
    fit_growth,
    mask_fraction,
    project,
)
from precision_plugin.errors import PrecisionConfigError


def _batch(sequence_sums: list[float], width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose log-ratios sum to ``sequence_sums``, spread evenly over ``width`` tokens."""
    train = torch.full((len(sequence_sums), width), -1.0, dtype=torch.float64)
    rollout = train - torch.tensor(sequence_sums, dtype=torch.float64)[:, None] / width
    return train, rollout


def test_shares_and_ess_on_known_sequence_ratios():
    # S: 1.2 > log 3 (TRL and verl drop it), 0.8 > log 2 (verl only), -0.8 < log 0.5 (verl
    # only), 0.1 (kept by both).
    sums = [1.2, 0.8, -0.8, 0.1]
    c = compute_consequence(*_batch(sums))
    assert c.sequences == 4 and c.tokens == 16
    assert c.seq_mask_fraction_trl == 0.25
    assert c.seq_mask_fraction_verl == 0.75
    w = [math.exp(s) for s in sums]
    assert c.ess == pytest.approx(sum(w) ** 2 / (4 * sum(x * x for x in w)), rel=1e-12)
    # Per token: 0.3 and 0.2 are below log 2, so nothing is clipped at 2.0.
    assert c.tis_clip_fraction == 0.0


def test_tis_clip_counts_tokens_above_log_two():
    train = torch.tensor([[-5.0, -5.0, -5.0, -5.0]], dtype=torch.float64)  # log-probs are <= 0
    rollout = train - torch.tensor([[0.7, 0.69, -3.0, 2.0]], dtype=torch.float64)
    c = compute_consequence(train, rollout)
    assert c.tis_clip_fraction == 0.5  # 0.7 and 2.0 exceed log 2 = 0.6931...


def test_ess_is_exact_where_the_weights_overflow_float64():
    # S = 800 and 800 + log 2: the weights are 1 : 2 times e^800 (overflow in float64).
    train, rollout = _batch([800.0, 800.0 + math.log(2.0)], width=1)
    c = compute_consequence(train, rollout)
    assert c.ess == pytest.approx(9.0 / (2.0 * 5.0), rel=1e-12)
    assert c.seq_mask_fraction_trl == 1.0 and c.seq_mask_fraction_verl == 1.0


def test_nan_tokens_and_masked_tokens_are_left_out():
    train = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    rollout = torch.tensor([[-2.0, math.nan, -3.0], [-1.0, -5.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    c = compute_consequence(train, rollout, mask)
    assert (c.sequences, c.tokens) == (2, 4)
    # row 0: S = 1 (the NaN token skipped); row 1: S = 0 (the masked -4 gap skipped)
    assert c.seq_mask_fraction_verl == 0.5 and c.seq_mask_fraction_trl == 0.0
    assert c.tis_clip_fraction == 0.25
    e = math.e
    assert c.ess == pytest.approx((e + 1) ** 2 / (2 * (e * e + 1)), rel=1e-12)


def test_no_sequence_gives_nan_and_zero_counts():
    c = compute_consequence(*_batch([0.5]), torch.zeros(1, 4))
    assert c.sequences == 0 and c.tokens == 0
    assert all(math.isnan(v) for v in (c.ess, c.seq_mask_fraction_trl, c.tis_clip_fraction))


@pytest.mark.parametrize("cuts", [(1,), (2, 5), (3, 4, 6)])
def test_shards_add_up_to_the_whole_batch(cuts):
    g = torch.Generator().manual_seed(3)
    train = -3.0 * torch.rand(7, 9, generator=g, dtype=torch.float64) - 3.0  # log-probs <= 0
    rollout = train + 0.5 * torch.randn(7, 9, generator=g, dtype=torch.float64)
    mask = torch.arange(9)[None, :] < torch.randint(1, 10, (7, 1), generator=g)
    whole = compute_consequence(train, rollout, mask)
    bounds = [0, *cuts, 7]
    parts = [
        consequence_sums(train[a:b], rollout[a:b], mask[a:b]) for a, b in itertools.pairwise(bounds)
    ]
    counts = torch.stack([p[0] for p in parts]).sum(dim=0)
    moments = combine_log_moments(torch.stack([p[1] for p in parts]))
    assert consequence_from_sums(counts, moments).to_dict() == pytest.approx(whole.to_dict())
    assert 0.0 < whole.ess < 1.0 and 0.0 < whole.seq_mask_fraction_verl < 1.0


def test_mask_bounds_are_the_frameworks_defaults():
    assert (TRL_SEQUENCE_MASK.low, TRL_SEQUENCE_MASK.high) == (None, 3.0)
    assert (VERL_SEQUENCE_MASK.low, VERL_SEQUENCE_MASK.high) == (0.5, 2.0)
    assert TRL_SEQUENCE_MASK.bounds == "w ≤ 3" and VERL_SEQUENCE_MASK.bounds == "0.5 ≤ w ≤ 2"


def test_chi2_quantiles_match_the_tables():
    # Standard chi-square table values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
    assert chi2_quantile(0.95, 7) == pytest.approx(14.067, abs=5e-4)
    assert chi2_quantile(0.05, 7) == pytest.approx(2.167, abs=5e-4)
    assert chi2_quantile(0.95, 1) == pytest.approx(3.841, abs=5e-4)
    with pytest.raises(PrecisionConfigError):
        chi2_quantile(1.0, 3)


def test_growth_fit_is_weighted_least_squares_with_a_chi_square_interval():
    sums, lengths = [1.0, -2.0, 0.5, 3.0], [100, 200, 300, 400]
    fit = fit_growth(sums, lengths, clipped_tokens=3)
    drift = 2.5 / 1000
    variance = sum((s - drift * n) ** 2 / n for s, n in zip(sums, lengths, strict=True)) / 3
    assert fit.drift == pytest.approx(drift, rel=1e-12)
    assert fit.variance == pytest.approx(variance, rel=1e-12)
    assert fit.drift_stderr == pytest.approx(math.sqrt(variance / 1000), rel=1e-12)
    tail = (1 - COVERAGE) / 2
    assert fit.variance_low == pytest.approx(3 * variance / chi2_quantile(1 - tail, 3))
    assert fit.variance_high == pytest.approx(3 * variance / chi2_quantile(tail, 3))
    assert fit.tis_clip.value == 0.003
    exact = scipy.stats.binomtest(3, 1000).proportion_ci(0.9, method="exact")
    assert (fit.tis_clip.low, fit.tis_clip.high) == (exact.low, exact.high)  # Clopper-Pearson
    with pytest.raises(PrecisionConfigError, match="clipped_tokens"):
        fit_growth(sums, lengths, clipped_tokens=1001)


def test_projection_follows_the_random_walk():
    fit = fit_growth([0.2, -0.3, 0.1, 0.4, -0.1], [100, 200, 300, 400, 500])
    p = project(fit, 4096)
    assert p.ess.value == pytest.approx(math.exp(-fit.variance * 4096), rel=1e-12)
    # The projection uses the robust variance interval (heavy tails): chi-square with the
    # degrees of freedom of a variance at a Laplace's excess kurtosis (3) or the sample's.
    n, kurt = 5, max(fit.kurtosis, 3.0)
    dof = 2 / (2 / (n - 1) + kurt / n)
    high = fit.variance * dof / scipy.stats.chi2.ppf(0.05, dof)
    assert fit.variance_robust_high == pytest.approx(high, rel=1e-12)
    assert fit.variance_robust_high > fit.variance_high
    assert p.ess.low == pytest.approx(math.exp(-high * 4096), rel=1e-12)
    mean, sd = fit.drift * 4096, math.sqrt(fit.variance * 4096)
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))
    verl = phi((math.log(0.5) - mean) / sd) + 1 - phi((math.log(2.0) - mean) / sd)
    assert p.seq_mask_fraction_verl.value == pytest.approx(verl, rel=1e-12)
    assert p.seq_mask_fraction_trl.value == pytest.approx(1 - phi((math.log(3) - mean) / sd))
    for iv in (p.ess, p.seq_mask_fraction_trl, p.seq_mask_fraction_verl):
        assert iv.low <= iv.value <= iv.high
    # The two-sided share is smallest where S is centred in [0.5, 2]: inside the drift interval.
    half = 1.6448536269514722 * fit.drift_stderr
    assert fit.drift - half < 0.0 < fit.drift + half
    assert p.seq_mask_fraction_verl.low == pytest.approx(
        mask_fraction(VERL_SEQUENCE_MASK, 0.0, fit.variance_robust_low, 4096)
    )
    # Longer generations lose more of the batch.
    assert project(fit, 8192).ess.value < p.ess.value < project(fit, 512).ess.value
    with pytest.raises(PrecisionConfigError, match="length"):
        project(fit, 0)


def test_mask_fraction_without_spread_is_a_step():
    assert mask_fraction(VERL_SEQUENCE_MASK, 1e-3, 0.0, 1000) == 1.0  # S = 1 > log 2
    assert mask_fraction(VERL_SEQUENCE_MASK, 1e-4, 0.0, 1000) == 0.0


def test_the_trl_accumulator_reports_the_whole_batch_over_micro_batches():
    from precision_plugin.trl.telemetry import MismatchAccumulator

    g = torch.Generator().manual_seed(5)
    train = -2.0 * torch.rand(6, 10, generator=g, dtype=torch.float64) - 4.0  # log-probs <= 0
    rollout = train + 0.8 * torch.randn(6, 10, generator=g, dtype=torch.float64)
    mask = torch.arange(10)[None, :] < torch.tensor([[3], [10], [7], [1], [5], [9]])
    acc = MismatchAccumulator()
    for rows in ((0, 2), (2, 3), (3, 6)):
        acc.add(train[slice(*rows)], rollout[slice(*rows)], mask[slice(*rows)])
    flushed = acc.flush()
    whole = compute_consequence(train, rollout, mask)
    for name in ("ess", "seq_mask_fraction_trl", "seq_mask_fraction_verl", "tis_clip_fraction"):
        assert flushed[name] == pytest.approx(getattr(whole, name), rel=1e-12), name
    assert 0 < whole.seq_mask_fraction_verl < 1 and 0 < whole.tis_clip_fraction < 1
    assert acc.flush()["tokens"] == 0  # reset


def test_the_drift_comes_from_the_k3_sums_when_given():
    """E_mu[log pi - log mu] = -KL(mu||pi), which k3 estimates with far less noise than the
    signed mean: the projection takes its drift from the sequences' k3 sums."""
    sums, lengths, kl = [1.0, -2.0, 0.5, 3.0], [100, 200, 300, 400], [0.02, 0.05, 0.04, 0.09]
    plain = fit_growth(sums, lengths)
    fit = fit_growth(sums, lengths, seq_kl=kl)
    drift = -0.2 / 1000
    spread = sum((-k - drift * n) ** 2 / n for k, n in zip(kl, lengths, strict=True)) / 3
    assert (fit.drift_from, plain.drift_from) == ("k3", "k1")
    assert fit.drift == pytest.approx(drift, rel=1e-12)
    assert fit.drift_stderr == pytest.approx(math.sqrt(spread / 1000), rel=1e-12)
    assert (fit.variance, fit.variance_low, fit.variance_high) == (
        plain.variance,
        plain.variance_low,
        plain.variance_high,
    )  # the spread of S around its own mean, as before
    assert fit.to_dict()["drift_from"] == "k3"
