"""Mismatch metrics against hand-computed values, masks, NaN and degenerate inputs."""

from __future__ import annotations

import math

import pytest
import torch

from precision_plugin._core.metrics.consequence import CONSEQUENCE_METRICS
from precision_plugin._core.metrics.mismatch import (
    ALIASES,
    compute_mismatch,
    mismatch_sums,
    prefixed,
    verdict,
)
from precision_plugin.policy import MetricSettings


def test_hand_computed_single_sequence():
    pi = torch.tensor([0.5, 0.2])  # trainer probabilities
    mu = torch.tensor([0.4, 0.25])  # rollout probabilities
    m = compute_mismatch(pi.log(), mu.log())
    r = pi / mu  # 1.25, 0.8
    assert m.k1_kl == pytest.approx(float((mu.log() - pi.log()).mean()), abs=1e-7)
    assert m.k3_kl == pytest.approx(float((r - 1 - r.log()).mean()), rel=1e-5)
    assert m.prob_diff_mean == pytest.approx(0.075, rel=1e-5)  # (0.1 + 0.05) / 2
    assert m.prob_diff_max == pytest.approx(0.1, rel=1e-5)
    assert m.logp_abs_diff_mean == pytest.approx(
        (math.log(1.25) + abs(math.log(0.8))) / 2, rel=1e-5
    )
    assert m.logp_sq_diff_half_mean == pytest.approx(
        0.5 * (math.log(1.25) ** 2 + math.log(0.8) ** 2) / 2, rel=1e-5
    )
    assert m.logp_abs_diff_max == pytest.approx(math.log(1.25), rel=1e-5)
    assert m.prob_diff_std == pytest.approx(math.sqrt(2 * 0.025**2), rel=1e-5)  # n - 1 = 1
    assert m.mult_prob_error == pytest.approx((1.25 + 1.25) / 2, rel=1e-5)  # max(r, 1/r)
    assert m.prob_pearson == pytest.approx(1.0)  # two points, same order
    assert (m.tokens, m.nan_tokens, m.sequences) == (2, 0, 1)
    assert m.seq_log_ratio == pytest.approx([math.log(1.25) + math.log(0.8)], abs=1e-6)
    assert m.seq_lengths == [2]
    # the drift is -1000 k1 (token-weighted); one sequence has no standard error
    assert m.drift_per_1k == pytest.approx(-1000 * m.k1_kl, rel=1e-12)
    assert math.isnan(m.drift_per_1k_se)


def test_identical_policies_are_zero():
    lp = torch.log(torch.tensor([[0.3, 0.6, 0.1], [0.9, 0.05, 0.5]]))
    m = compute_mismatch(lp, lp.clone())
    assert m.k1_kl == 0 and m.k3_kl == 0 and m.prob_diff_max == 0 and m.logp_abs_diff_mean == 0
    assert m.logp_abs_diff_max == 0 and m.prob_diff_std == 0 and m.mult_prob_error == 1
    assert m.prob_pearson == pytest.approx(1.0)
    assert verdict(m)[0] == "ok"


def test_mask_and_nan_are_excluded_and_counted():
    nan = float("nan")
    pi = torch.tensor([[0.5, 0.2, 0.9], [0.3, nan, 0.7]]).log()
    mu = torch.tensor([[0.4, 0.25, 0.1], [0.3, 0.5, nan]]).log()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    m = compute_mismatch(pi, mu, mask)
    # Valid: (0,0), (0,1), (1,0). (0,2) masked out; (1,1) and (1,2) NaN: counted.
    assert (m.tokens, m.nan_tokens, m.sequences) == (3, 2, 2)
    assert m.prob_diff_mean == pytest.approx((0.1 + 0.05 + 0.0) / 3, rel=1e-5)
    assert all(math.isfinite(v) for v in (m.k1_kl, m.k3_kl, m.prob_diff_max, m.prob_pearson))
    assert m.seq_lengths == [2, 1]


def test_masked_nan_is_not_counted():
    pi = torch.tensor([[0.5, float("nan")]]).log()
    m = compute_mismatch(pi, pi.clone(), torch.tensor([[1, 0]]))
    assert (m.tokens, m.nan_tokens) == (1, 0)


def test_all_masked():
    lp = torch.zeros(2, 3)
    m = compute_mismatch(lp, lp, torch.zeros(2, 3))
    assert (m.tokens, m.nan_tokens, m.sequences) == (0, 0, 0)
    assert math.isnan(m.k3_kl) and math.isnan(m.prob_diff_mean)
    assert verdict(m)[0] == "invalid"


def test_all_nan():
    lp = torch.full((2, 2), float("nan"))
    m = compute_mismatch(lp, lp)
    assert (m.tokens, m.nan_tokens) == (0, 4) and math.isnan(m.k1_kl)


def test_drift_per_1k_tokens_is_minus_1000_k1_with_a_sequence_level_error():
    """Per-token log-ratios d (log π − log μ) of three sequences: the drift is 1000 ΣS / ΣL,
    its standard error that of the random-walk fit, computed here by hand."""
    rows = [[-1e-3, -3e-3, 2e-3], [-2e-3] * 5, [5e-4, -1e-3]]
    width = max(map(len, rows))
    mu = torch.full((3, width), math.log(0.5), dtype=torch.float64)
    pi = mu.clone()
    mask = torch.zeros(3, width)
    for i, d in enumerate(rows):
        pi[i, : len(d)] += torch.tensor(d, dtype=torch.float64)
        mask[i, : len(d)] = 1
    m = compute_mismatch(pi, mu, mask)
    sums = [sum(d) for d in rows]  # -2e-3, -1e-2, -5e-4
    lengths = [3, 5, 2]
    r = sum(sums) / sum(lengths)  # -0.00125
    # the random walk S ~ Normal(drift·L, variance·L): variance per token, its error on the drift
    variance = sum((s - r * n) ** 2 / n for s, n in zip(sums, lengths, strict=True)) / 2
    se = math.sqrt(variance / sum(lengths))
    assert m.seq_lengths == lengths and m.seq_log_ratio == pytest.approx(sums, abs=1e-15)
    assert m.drift_per_1k == pytest.approx(1000 * r, rel=1e-12)
    assert 1000 * r == pytest.approx(-1.25, rel=1e-12)
    assert m.drift_per_1k == pytest.approx(-1000 * m.k1_kl, rel=1e-12)
    assert m.drift_per_1k_se == pytest.approx(1000 * se, rel=1e-12)
    assert m.seq_kl == pytest.approx(-sum(sums) / 3, rel=1e-12)


def test_float16_and_bfloat16_inputs_accepted():
    lp = torch.log(torch.tensor([[0.5, 0.25]]))
    m = compute_mismatch(lp.to(torch.bfloat16), lp.to(torch.float16))
    assert m.tokens == 2 and m.k3_kl >= 0


def test_lists_go_straight_to_float64():
    """A list is not rounded to float32 on the way: a 1e-10 mismatch survives exactly."""
    pi, mu = [-0.1, -0.2], [-0.1 + 1e-10, -0.2 + 1e-10]
    m = compute_mismatch(pi, mu)
    exact = compute_mismatch(
        torch.tensor(pi, dtype=torch.float64), torch.tensor(mu, dtype=torch.float64)
    )
    assert m.k1_kl == exact.k1_kl and m.k1_kl == pytest.approx(1e-10, rel=1e-5, abs=0)
    assert compute_mismatch([[-0.1, None]], [[-0.1 + 1e-10, -0.3]], [[1, 1]]).tokens == 1


def test_k3_keeps_its_precision_for_tiny_mismatches():
    """k3 ~ d²/2: with d = 1e-9, exp(d) − 1 − d would be rounding noise, expm1(d) − d is not."""
    d = 1e-9
    pi = torch.full((4,), -0.5, dtype=torch.float64)
    m = compute_mismatch(pi + d, pi)
    assert m.k3_kl == pytest.approx(d * d / 2, rel=1e-6, abs=0)
    assert m.logp_sq_diff_half_mean == pytest.approx(d * d / 2, rel=1e-6, abs=0)


def test_lists_accepted_and_shape_errors():
    assert compute_mismatch([-0.1, -0.2], [-0.1, -0.2]).tokens == 2
    with pytest.raises(ValueError, match="shape"):
        compute_mismatch(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"'mask' differ in shape \(.*mask: \(3, 2\)\)"):
        compute_mismatch(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 2))


def test_none_from_an_engine_is_excluded_and_counted():
    m = compute_mismatch([[None, -0.1], [-0.3, -0.2]], [[-0.2, -0.1], [-0.3, None]])
    assert m.tokens == 2 and m.nan_tokens == 2 and m.k3_kl == pytest.approx(0.0)


def test_full_distributions_and_ragged_lists_are_refused():
    from precision_plugin.errors import PrecisionConfigError

    with pytest.raises(PrecisionConfigError, match=r"shape \(2, 3, 5\).*not the full"):
        compute_mismatch(torch.zeros(2, 3, 5), torch.zeros(2, 3, 5))
    with pytest.raises(PrecisionConfigError, match=r"'train_logprobs' got .* not a rectangular"):
        compute_mismatch([[-0.1, -0.2], [-0.3]], [[-0.1, -0.2], [-0.3, -0.1]])


def test_k3_is_nonnegative_and_matches_kl_for_small_noise():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 32, 50, generator=g)
    mu_logp = logits.log_softmax(-1)
    pi_logp = (logits + 1e-3 * torch.randn(logits.shape, generator=g)).log_softmax(-1)
    tokens = torch.distributions.Categorical(logits=mu_logp).sample()
    pick = lambda lp: lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    m = compute_mismatch(pick(pi_logp), pick(mu_logp))
    exact_kl = float((mu_logp.exp() * (mu_logp - pi_logp)).sum(-1).mean())
    assert m.k3_kl >= 0
    assert m.k3_kl == pytest.approx(exact_kl, rel=0.2)


def test_verdict_thresholds():
    lp = torch.log(torch.tensor([0.5]))
    ok = compute_mismatch(lp, torch.log(torch.tensor([0.497])))
    watch = compute_mismatch(lp, torch.log(torch.tensor([0.492])))
    bad = compute_mismatch(lp, torch.log(torch.tensor([0.45])))
    assert [verdict(x)[0] for x in (ok, watch, bad)] == ["ok", "watch", "problem"]
    strict = MetricSettings(prob_diff_ok=0.001, prob_diff_bad=0.002)
    assert verdict(ok, strict)[0] == "problem"


def test_prefixed_and_aliases():
    m = compute_mismatch([-0.1], [-0.2])
    logged = prefixed(m)
    assert set(logged) >= {"precision/k3_kl", "precision/prob_diff_mean", "precision/tokens"}
    assert "seq_log_ratio" not in m.to_dict()
    assert set(ALIASES) <= set(m.to_dict()) | set(CONSEQUENCE_METRICS)
    assert {"logp_abs_diff_max", "prob_diff_std", "mult_prob_error"} <= set(m.to_dict())


def test_a_probability_of_zero_counts_as_total_disagreement():
    """-inf is a log-prob (probability 0), not a missing one: the token counts, the log-ratio
    metrics are infinite, and the verdict is a problem, however small the mean |π − μ|."""
    pi = [[math.log(0.5), -math.inf], [math.log(0.25), -math.inf]]
    mu = [[math.log(0.5), math.log(1e-4)], [math.log(0.25), -math.inf]]
    m = compute_mismatch(pi, mu)
    assert (m.tokens, m.nan_tokens) == (4, 0)
    assert m.prob_diff_mean == pytest.approx(1e-4 / 4, rel=1e-12)
    assert m.prob_diff_max == pytest.approx(1e-4, rel=1e-12)
    assert m.k1_kl == math.inf and m.k3_kl == math.inf and m.logp_abs_diff_max == math.inf
    label, reason = verdict(m)
    assert label == "problem" and "probability 0" in reason
    # Both sides at probability 0 agree: that token adds nothing.
    both = compute_mismatch([[-0.5, -math.inf]], [[-0.5, -math.inf]])
    assert both.tokens == 2 and both.k3_kl == 0 and verdict(both)[0] == "ok"


@pytest.mark.parametrize("bad", [[[0.5, 0.25]], [[-0.1, math.inf]], [[-0.2, 0.02]]])
def test_values_above_zero_are_no_log_probs(bad):
    from precision_plugin.errors import PrecisionConfigError

    with pytest.raises(PrecisionConfigError, match=r"argument 'rollout_logprobs'.*above 0"):
        compute_mismatch([[-0.1, -0.1]], bad)
    with pytest.raises(PrecisionConfigError, match=r"argument 'train_logprobs'.*above 0"):
        mismatch_sums(bad, [[-0.1, -0.1]])
    # Rounding noise of a log-softmax (a few ulps above 0) is a log-prob.
    assert compute_mismatch([[1e-7, -0.1]], [[0.0, -0.1]]).tokens == 2


def test_the_drift_fit_at_its_edges_one_token_two_sequences_no_token():
    """``drift_fit`` exactly (float64 arithmetic): a single one-token sequence gives its drift
    and NaN spread; two sequences (the fewest with a variance) give all three; no token gives
    NaN, and a residual rounded below zero gives a zero variance."""
    from precision_plugin._core.metrics.mismatch import drift_fit, fit_drift

    drift, stderr, variance = drift_fit([1], [0.25])
    assert drift == 0.25 and math.isnan(stderr) and math.isnan(variance)
    # drift = 2 / 4; residual = (1 - 0.5)² / 1 + (1 - 1.5)² / 3 = 1/3 over n - 1 = 1.
    assert drift_fit([1, 3], [1.0, 1.0]) == (0.5, math.sqrt((1 / 3) / 4), 1 / 3)
    assert all(math.isnan(v) for v in drift_fit([0, 0], [0.0, 0.0]))
    assert all(math.isnan(v) for v in fit_drift(0, 0.0, 0.0, lambda d: 0.0))
    assert fit_drift(3, 2.0, 1.0, lambda d: -1e-18) == (0.5, 0.0, 0.0)
