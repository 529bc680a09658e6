"""mismatch_sums / metrics_from_sums: shard sums give the whole batch's token-weighted metrics."""

from __future__ import annotations

import math

import pytest
import torch

from precision_plugin._core.metrics.mismatch import (
    SUM_FIELDS,
    compute_mismatch,
    metrics_from_sums,
    mismatch_sums,
)
from precision_plugin.errors import PrecisionConfigError


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    train = -3.0 * torch.rand(7, 11, generator=g, dtype=torch.float64)
    rollout = train + 1e-2 * torch.randn(7, 11, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, 12, (7,), generator=g)
    mask = torch.arange(11)[None, :] < lengths[:, None]  # ragged, right-padded
    rollout[1, 0] = math.nan  # a token the engine did not score
    rollout[2, 10] = math.nan  # outside the mask: not counted at all
    mask[2, 10] = False
    return train, rollout, mask


@pytest.mark.parametrize("cuts", [(7,), (3, 7), (1, 2, 5, 7)])
def test_shards_add_up_to_the_whole_batch(cuts: tuple[int, ...]) -> None:
    train, rollout, mask = _batch()
    whole = compute_mismatch(train, rollout, mask).to_dict()
    sums, maxima, start = torch.zeros(len(SUM_FIELDS), dtype=torch.float64), [], 0
    for end in cuts:
        s, m = mismatch_sums(train[start:end], rollout[start:end], mask[start:end])
        sums, start = sums + s, end
        maxima.append(m)
    got = metrics_from_sums(sums, torch.cat(maxima))
    assert set(got) == {
        "k1_kl", "k3_kl", "prob_diff_mean", "prob_diff_max", "logp_abs_diff_mean",
        "drift_per_1k", "drift_per_1k_se", "tokens", "nan_tokens",
    }  # fmt: skip
    for name, value in got.items():
        assert value == pytest.approx(whole[name], rel=1e-9, abs=1e-15), name
    assert got["nan_tokens"] == 1


def test_no_valid_token_gives_nan_means_and_zero_tokens() -> None:
    sums, top = mismatch_sums([[math.nan, 0.0]], [[0.0, 0.0]], [[1, 0]])
    got = metrics_from_sums(sums, top)
    assert got["tokens"] == 0 and got["nan_tokens"] == 1
    assert all(math.isnan(got[k]) for k in ("k1_kl", "k3_kl", "prob_diff_max"))


def test_mismatched_shapes_are_a_config_error() -> None:
    with pytest.raises(PrecisionConfigError, match="same tokens"):
        mismatch_sums(torch.zeros(2, 3), torch.zeros(2, 4))
