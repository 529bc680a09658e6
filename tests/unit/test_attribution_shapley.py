"""probe --attribute's shares (issue 53): the Shapley split of the k3 total pinned against an
independent computation (every order of the causes, numpy), the parts adding up to the total,
one bootstrap over sequences for every interval (pinned against the same draws recomputed
here), a cause with no effect not distinguishable from 0, the advice naming only causes whose
intervals separate, the table of a new and of an old results file."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from precision_plugin._core.decision import Attribution
from precision_plugin._core.intervals import COVERAGE
from precision_plugin.probe.attribution.decompose import (
    BOOTSTRAP,
    BOOTSTRAP_SEED,
    SHAPLEY_MAX_CAUSES,
    cause_shares,
    k3_interval,
    shapley_weights,
    share_method,
    subsets_needed,
)
from precision_plugin.probe.attribution.fixes import change_evidence, first_change


def _rows(rng: np.random.Generator, lengths: list[int], scale: float) -> list[list[float]]:
    return [list(rng.normal(0.0, scale, n)) for n in lengths]


def _game(k: int, seed: int = 0) -> tuple[list[list[float]], dict[int, list[list[float]]]]:
    """A total and the log-ratios of every subset of ``k`` causes: subset ``S``'s are the sum
    of its causes' own per-token terms plus a pair term for causes 0 and 1 together (an
    interaction, so the Shapley values are not each cause alone), on 7 sequences."""
    rng = np.random.default_rng(seed)
    lengths = [5, 3, 8, 1, 6, 4, 2]
    own = [_rows(rng, lengths, 0.1 * (i + 1)) for i in range(k)]
    pair = _rows(rng, lengths, 0.15)
    subsets: dict[int, list[list[float]]] = {}
    for mask in range(1, 1 << k):
        rows = []
        for s, n in enumerate(lengths):
            d = np.zeros(n)
            for i in range(k):
                if mask >> i & 1:
                    d = d + np.asarray(own[i][s])
            if mask & 3 == 3:
                d = d + np.asarray(pair[s])
            rows.append(list(d))
        subsets[mask] = rows
    extra = _rows(rng, lengths, 0.02)
    full = subsets[(1 << k) - 1]
    total = [list(np.asarray(a) + np.asarray(b)) for a, b in zip(full, extra, strict=True)]
    return total, subsets


def _v(rows: list[list[float]]) -> float:
    """k3 = mean over tokens of e^-d - 1 + d, numpy."""
    d = np.concatenate([np.asarray(r, dtype=np.float64) for r in rows])
    return float(np.mean(np.expm1(-d) + d))


def _shapley_by_orders(k: int, v: dict[int, float]) -> list[float]:
    """Each player's marginal contribution averaged over all k! orders (no weight formula)."""
    phi = [0.0] * k
    orders = list(itertools.permutations(range(k)))
    for order in orders:
        mask = 0
        for i in order:
            phi[i] += v[mask | 1 << i] - v[mask]
            mask |= 1 << i
    return [p / len(orders) for p in phi]


@pytest.mark.parametrize("k", [2, 3])
def test_shapley_parts_equal_the_average_over_every_order(k: int) -> None:
    total, subsets = _game(k)
    causes = ["dtype", "decode", "batch"][:k]
    got = cause_shares(total, subsets, causes)
    v = {0: 0.0, **{m: _v(rows) for m, rows in subsets.items()}}
    want = _shapley_by_orders(k, v)
    for cause, phi in zip(causes, want, strict=True):
        assert got.parts[cause].value == pytest.approx(phi, rel=1e-12, abs=1e-15)
    # efficiency: the parts add up to v(all causes), the residual to the measured total
    full = (1 << k) - 1
    assert math.fsum(p.value for p in got.parts.values()) == pytest.approx(v[full], rel=1e-12)
    assert got.total.value == pytest.approx(_v(total), rel=1e-12)
    assert got.residual.value == pytest.approx(_v(total) - v[full], rel=1e-12, abs=1e-15)
    parts = math.fsum([*(p.value for p in got.parts.values()), got.residual.value])
    assert parts == pytest.approx(got.total.value, rel=1e-12)
    shares = math.fsum([*(p.share for p in got.parts.values()), got.residual.share])
    assert shares == pytest.approx(1.0, abs=1e-12)
    assert got.method == "shapley" and got.passes == (1 << k) - 1


def test_a_hand_built_two_cause_table() -> None:
    # One token per sequence. v(a) = k3(0.2), v(b) = k3(-0.3), v(ab) = k3(0.5): Shapley
    # a = (v(a) + v(ab) - v(b)) / 2, b = (v(b) + v(ab) - v(a)) / 2.
    def k3(x: float) -> float:
        return math.expm1(-x) + x

    subsets = {1: [[0.2], [0.2]], 2: [[-0.3], [-0.3]], 3: [[0.5], [0.5]]}
    got = cause_shares([[0.5], [0.5]], subsets, ["a", "b"])
    a = (k3(0.2) + k3(0.5) - k3(-0.3)) / 2
    b = (k3(-0.3) + k3(0.5) - k3(0.2)) / 2
    assert got.parts["a"].value == pytest.approx(a, rel=1e-12)
    assert got.parts["b"].value == pytest.approx(b, rel=1e-12)
    assert got.residual.value == 0.0
    # the same two sequences in every resample: each interval is the value itself
    assert got.parts["a"].low == pytest.approx(a, rel=1e-12)
    assert got.parts["a"].high == pytest.approx(a, rel=1e-12)


def test_the_weights_of_three_players() -> None:
    # phi_0 = 1/3 (v1 - v0) + 1/6 (v3 - v2) + 1/6 (v5 - v4) + 1/3 (v7 - v6)
    w = shapley_weights(3)[0]
    third, sixth = 1 / 3, 1 / 6
    assert w == pytest.approx(
        [-third, third, -sixth, sixth, -sixth, sixth, -third, third], abs=1e-15
    )
    assert all(math.fsum(row) == pytest.approx(0.0, abs=1e-15) for row in shapley_weights(4))


@pytest.mark.parametrize("k", [2, 3])
def test_every_interval_is_one_bootstrap_over_sequences(k: int) -> None:
    """The parts' and shares' intervals, recomputed here: the same draws as k3_interval's
    (torch.randint with the fixed seed), the per-sequence k3 sums of each subset, the Shapley
    value per resample by every order; and each interval brackets its value."""
    total, subsets = _game(k, seed=3)
    causes = ["dtype", "decode", "batch"][:k]
    got = cause_shares(total, subsets, causes)
    n = len(total)
    generator = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    picks = torch.randint(0, n, (BOOTSTRAP, n), generator=generator).numpy()

    def seq_sums(rows: list[list[float]]) -> np.ndarray:
        return np.array([np.sum(np.expm1(-np.asarray(r)) + np.asarray(r)) for r in rows])

    counts = np.array([len(r) for r in total], dtype=np.float64)
    sums = {0: np.zeros(n), **{m: seq_sums(rows) for m, rows in subsets.items()}}
    tot = seq_sums(total)
    phis, totals = [], []
    for pick in picks:
        tokens = counts[pick].sum()
        v = {m: s[pick].sum() / tokens for m, s in sums.items()}
        phis.append(_shapley_by_orders(k, v))
        totals.append(tot[pick].sum() / tokens)
    phis_a, totals_a = np.array(phis), np.array(totals)
    tail = (1 - COVERAGE) / 2
    for i, cause in enumerate(causes):
        part = got.parts[cause]
        low, high = np.quantile(phis_a[:, i], [tail, 1 - tail])
        assert (part.low, part.high) == pytest.approx((low, high), rel=1e-9)
        s_low, s_high = np.quantile(phis_a[:, i] / totals_a, [tail, 1 - tail])
        assert (part.share_low, part.share_high) == pytest.approx((s_low, s_high), rel=1e-9)
        assert part.low <= part.value <= part.high
        assert part.share_low <= part.share <= part.share_high
    # the total's interval is k3_interval's, the same draws
    assert got.total == k3_interval(total)


def test_a_cause_with_no_effect_is_not_distinguishable_from_0() -> None:
    # cause "batch" (bit 1) changes nothing: every subset with it equals the subset without.
    total, subsets = _game(3, seed=5)
    for mask in range(1, 8):
        if mask & 2:
            subsets[mask] = subsets[mask & ~2] if mask & ~2 else [[0.0] * len(r) for r in total]
    got = cause_shares(total, subsets, ["dtype", "batch", "decode"])
    nothing = got.parts["batch"]
    assert nothing.value == 0.0 and (nothing.low, nothing.high) == (0.0, 0.0)
    assert not nothing.distinguishable
    assert got.parts["dtype"].distinguishable and got.parts["decode"].distinguishable

    from precision_plugin.probe.attribution.decompose import K3
    from precision_plugin.probe.attribution.report import CauseRow

    row = CauseRow("batch", True, K3(0.0, 0.0, 0.0), 0.0, 0.0, 1.0, 10, split=nothing)
    data = row.to_dict()
    assert data["distinguishable_from_0"] is False
    assert data["note"].startswith("not distinguishable from 0 (90% interval holds 0)")
    assert data["share_interval"] == [0.0, 0.0]


def test_one_sequence_has_no_interval_and_no_part_told_apart_from_0() -> None:
    got = cause_shares([[0.3, -0.1]], {1: [[0.3, -0.1]]}, ["dtype"])
    part = got.parts["dtype"]
    assert part.share == 1.0 and math.isnan(part.low) and not part.distinguishable


def test_above_six_causes_the_parts_are_the_sequential_saving() -> None:
    assert share_method(SHAPLEY_MAX_CAUSES) == "shapley"
    assert share_method(SHAPLEY_MAX_CAUSES + 1) == "sequential"
    assert subsets_needed(3, "sequential") == [1, 3, 7]
    total, subsets = _game(3, seed=2)
    got = cause_shares(total, subsets, ["a", "b", "c"], method="sequential")
    v = {0: 0.0, **{m: _v(rows) for m, rows in subsets.items()}}
    for cause, (after, before) in zip("abc", [(1, 0), (3, 1), (7, 3)], strict=True):
        assert got.parts[cause].value == pytest.approx(v[after] - v[before], rel=1e-12)
    assert got.passes == 3


def test_a_missing_subset_or_other_tokens_are_refused() -> None:
    from precision_plugin.errors import PrecisionConfigError

    total, subsets = _game(2)
    with pytest.raises(PrecisionConfigError, match="no mask 3"):
        cause_shares(total, {1: subsets[1], 2: subsets[2]}, ["a", "b"])
    with pytest.raises(PrecisionConfigError, match="other tokens"):
        cause_shares(total, {**subsets, 3: subsets[3][:-1]}, ["a", "b"])


def _row(share: float, low: float, high: float, *, k3: float = 1e-3) -> dict[str, Any]:
    return {"share": share, "k3": k3, "in_total": True, "share_interval": [low, high]}


def test_the_advice_names_only_causes_whose_intervals_separate_from_0() -> None:
    rows = {
        "float16": {
            "dtype": _row(0.1, 0.05, 0.15),
            "kv_cache": _row(0.6, -0.1, 1.2),  # the largest share, its interval holds 0
            "sampling": _row(0.25, 0.1, 0.4),
        }
    }
    got = first_change(rows)
    assert got is not None and got.cause == "sampling" and got.tied == {}
    assert got.share_interval == (0.1, 0.4)
    assert "sampling (25% [10%, 40%] of the mismatch" in got.line()
    # nothing separates from 0 (an interval from exactly 0 holds it): no advice
    none = {
        "float16": {
            "kv_cache": _row(0.6, -0.1, 1.2),
            "sampling": _row(0.2, math.nan, 0.3),
            "batch": _row(0.1, 0.0, 0.3),
        }
    }
    assert first_change(none) is None
    # two separated causes whose intervals overlap are not ranked against each other
    tied = {"float16": {"kv_cache": _row(0.5, 0.3, 0.7), "sampling": _row(0.4, 0.2, 0.6)}}
    got = first_change(tied)
    assert got is not None and got.cause == "kv_cache" and list(got.tied) == ["sampling"]
    assert "not ranked above sampling" in got.line()
    apart = {"float16": {"kv_cache": _row(0.7, 0.6, 0.8), "sampling": _row(0.2, 0.1, 0.3)}}
    assert first_change(apart).tied == {}  # type: ignore[union-attr]


def test_the_advice_line_gives_the_intervals_and_ranks_only_what_separates() -> None:
    rows = {
        "float16": {
            "dtype": _row(0.05, 0.02, 0.08),
            "kv_cache": _row(0.5, 0.3, 0.7),
            "sampling": _row(0.4, 0.2, 0.6),
        }
    }
    got = change_evidence(first_change(rows), rows)
    assert got is not None and got.dominates
    assert got.dtype_interval == (0.02, 0.08)
    assert got.clause() == (
        "change kv_cache_dtype and top_p, top_k, logprobs_mode first (shares of the float16 "
        "mismatch in this rollout: kv_cache_dtype 50% [30%–70%] and top_p, top_k, "
        "logprobs_mode 40% [20%–60%], not distinguishable from each other; the dtype's own "
        "rounding 5.0% [2.0%–8.0%]): --rollout kv_cache_dtype=auto · vLLM --kv-cache-dtype "
        "auto · SGLang --kv-cache-dtype auto · verl "
        "++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=auto"
    )
    # a setting whose interval overlaps the dtype's own is not ranked above it
    close = Attribution(
        "bfloat16", "kv_cache", 0.5, "kv_cache_dtype", {}, 0.4,
        share_interval=(0.3, 0.7), dtype_interval=(0.2, 0.6),
    )  # fmt: skip
    assert not close.dominates
    # results without intervals keep the old rule
    assert Attribution("float16", "kv_cache", 0.5, "kv_cache_dtype", {}, 0.4).dominates


def _section(note: bool) -> dict[str, Any]:
    cause = {
        "in_total": True, "k3": 1e-3, "k3_interval": [5e-4, 2e-3], "part": 8e-4, "share": 0.8,
        "share_interval": [0.6, 0.95], "bitwise_equal": 0.1, "tokens": 10,
        "distinguishable_from_0": True, "fixes": {"vLLM": "--kv-cache-dtype auto"},
    }  # fmt: skip
    batch = {
        **cause, "part": 1e-5, "share": 0.01, "share_interval": [-0.02, 0.04],
        "distinguishable_from_0": False, "fixes": {"vLLM": "VLLM_BATCH_INVARIANT=1"},
    }  # fmt: skip
    if note:
        batch["note"] = "not distinguishable from 0 (90% interval holds 0)"
    return {
        "shares": "shapley",
        "coverage": COVERAGE,
        "learning_rate": 1e-6,
        "rollout": {},
        "dtypes": {
            "float16": {
                "total": {"k3": 1e-3, "k3_interval": [5e-4, 2e-3], "bitwise_equal": 0.0},
                "causes": {"kv_cache": cause, "batch": batch},
                "shares": "shapley",
                "residual": {"part": 1e-4, "share": 0.1, "share_interval": [0.05, 0.2]},
            }
        },
    }


def test_the_table_of_a_shapley_section_shows_the_intervals_and_the_words() -> None:
    import io
    import re

    from rich.console import Console

    from precision_plugin.probe.attribution.render import render_attribution_table

    console = Console(width=250, record=True, file=io.StringIO(), color_system=None)
    console.print(render_attribution_table(_section(note=True)))
    flat = re.sub(r"\s+", " ", console.export_text())
    assert "share [90% CI]" in flat
    assert "80% [60%, 95%]" in flat and "1% [-2%, 4%]" in flat
    assert "not distinguishable from 0 (90% interval holds 0). vLLM: VLLM_BATCH_INVARIANT=1" in (
        flat
    )
    assert "Shapley shares of k3" in flat and "interaction" not in flat
    assert "residual" in flat and "10% [5%, 20%]" in flat


def test_an_old_results_file_keeps_its_table() -> None:
    """Results written before the Shapley shares (no "shares" key): the share column without
    an interval, the interaction row and the E[d^2]/2 caption, as the docs show them."""
    import io
    import json
    import re
    from pathlib import Path

    from rich.console import Console

    from precision_plugin.probe.attribution.render import render_attribution_table

    path = Path(__file__).parents[2] / "docs/results/attribution-smollm2-1024-rollout.json"
    section = json.loads(path.read_text())["attribution"]
    assert "shares" not in section
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(render_attribution_table(section))
    flat = re.sub(r"\s+", " ", console.export_text())
    assert "share [" not in flat and "interaction" in flat
    assert "Shares of E[d^2]/2" in flat


def _report(shares: bool) -> Any:
    """A report of two dtypes whose rows cover what the table shows: a Shapley split with
    intervals (and a negative part's note), a row of one sequence (no interval: NaN), a what-if
    with MoE expert flips, the sampling row of a truncated rollout, a layerwise sentence, the
    change-first and notes; ``shares=False``: a block as written before the shares."""
    from precision_plugin.probe.attribution.decompose import K3
    from precision_plugin.probe.attribution.report import (
        AttributionReport,
        CauseRow,
        DtypeAttribution,
    )
    from precision_plugin.probe.attribution.settings import RolloutSettings

    total, subsets = _game(3, seed=1)
    got = cause_shares(total, subsets, ["dtype", "batch", "decode"])
    report = AttributionReport(RolloutSettings(top_p=0.9, kv_cache_dtype="fp8"), 3e-6)
    for dtype, scale in (("float16", 1.0), ("bfloat16", 40.0)):
        rows = []
        for cause, p in got.parts.items():
            k3 = K3(p.value * scale, p.low * scale, p.high * scale)
            rows.append(CauseRow(cause, True, k3, p.value, p.share, 0.25, 41, split=p))
        rows.append(CauseRow("sampling", True, K3(0.0, math.nan, math.nan), 0.0, None, 1.0, 41,
                             truncation=-0.1014, truncation_tokens=72))  # fmt: skip
        rows.append(CauseRow("router", False, K3(2e-4, 1e-4, 3e-4), 2e-4, None, 0.5, 41,
                             what_if="the router in float32", expert_flips=0.031))  # fmt: skip
        block = DtypeAttribution(
            dtype, got.total, got.total.value, 0.125, 41, rows, interaction=1e-5,
            residual=got.residual.value, conventions={}, shares=got if shares else None,
            layerwise="largest cause dtype: layer 3 (mlp)" if dtype == "bfloat16" else None,
        )  # fmt: skip
        report.dtypes[dtype] = block
    report.first = first_change(report.first_rows())
    report.notes.append("attribution: a note under the table")
    return report


@pytest.mark.parametrize("shares", [True, False])
def test_the_table_of_the_report_is_the_table_of_its_json(shares: bool) -> None:
    """Issue 55: the probe renders the table from the report and the decision objects, the docs
    from a results file's JSON; both give the same text, byte for byte, at any width."""
    import io

    from rich.console import Console

    from precision_plugin._core.decision import Decision
    from precision_plugin.probe.attribution.render import render_attribution_table

    report = _report(shares)
    decisions = [
        None,
        Decision("train", "float16", "attribution", "do: x.", change_first="kv_cache_dtype"),
        Decision("train", "float16", "consequence", "do: train in float16."),
        Decision("nothing", None, "none", "do: nothing to compare."),
    ]
    for decision in decisions:
        as_json = decision.to_dict() if decision is not None else None
        for width in (80, 250):
            texts = []
            for section, chosen in ((report, decision), (report.to_dict(), as_json)):
                console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
                console.print(render_attribution_table(section, chosen))
                texts.append(console.export_text())
            assert texts[0] == texts[1]
            assert "experts flip 3.1%" in texts[0] and "layerwise (bfloat16)" in texts[0]
