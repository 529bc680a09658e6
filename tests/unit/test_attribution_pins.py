"""Exact values of the attribution's small pieces, each computed here independently: the
log-ratio's direction, the bootstrap's quantiles, the batch rescore's order and difference, the
k3 term's overflow edge, the settings' defaults and switches, the fixes' keys, the first change,
the table's interval cell and the two sides' log-prob conventions. (A mutation pass planted
one-line bugs in each; these are the tests that catch them.)"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
import torch

from precision_plugin._core.metrics.k3 import _LARGEST, EXPM1_CAP, capped_k3_term, k3_term, k3_terms
from precision_plugin._core.scoring import TokenSequence, batch_rescore
from precision_plugin._core.scoring.bitwise import BitwiseEqual
from precision_plugin._core.scoring.rescore import BatchRescore
from precision_plugin.probe.attribution import RolloutSettings, k3_interval, parse_rollout
from precision_plugin.probe.attribution.decompose import log_ratio
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE, CAUSES, first_change
from precision_plugin.probe.attribution.measure import (
    DEFAULT_LEARNING_RATE,
    _half_mean_sq,
    engine_transform,
    trainer_transform,
)
from precision_plugin.probe.attribution.render import _interval
from precision_plugin.probe.attribution.settings import AttributionSettings


def test_log_ratio_is_side_minus_reference_and_equal_infinities_are_zero() -> None:
    got = log_ratio([[-1.0, -2.0, -math.inf]], [[-1.5, -2.0, -math.inf]])
    assert got == [[0.5, 0.0, 0.0]]


def test_k3_interval_is_the_5_and_95_percentiles_of_sequence_resamples() -> None:
    """The project's one coverage, 90 %: the 5th and 95th percentiles of the resamples."""
    rows = [[0.1, -0.2], [0.3], [-0.05, 0.02, 0.4], [0.0]]
    got = k3_interval(rows, resamples=500, seed=7)
    # The same bootstrap written out: resample whole sequences, ratio of summed terms to tokens.
    sums = torch.tensor(
        [math.fsum(math.expm1(-x) + x for x in r) for r in rows], dtype=torch.float64
    )
    counts = torch.tensor([float(len(r)) for r in rows], dtype=torch.float64)
    picks = torch.randint(0, 4, (500, 4), generator=torch.Generator().manual_seed(7))
    estimates = sums[picks].sum(1) / counts[picks].sum(1)
    assert got.low == float(torch.quantile(estimates, torch.tensor(0.05, dtype=torch.float64)))
    assert got.high == float(torch.quantile(estimates, torch.tensor(0.95, dtype=torch.float64)))
    assert got.value == float(sums.sum() / counts.sum())


class _Recording:
    """A scorer that remembers which sequences shared each call."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        self.calls.append([s.prompt_ids[0] for s in sequences])
        return [[-1.0] * len(s.completion_ids) for s in sequences]


@pytest.mark.parametrize("seed", [0, 5])
def test_batch_rescore_batches_in_the_seeded_shuffled_order(seed: int) -> None:
    seqs = [TokenSequence((i,), (1, 2)) for i in range(7)]
    scorer = _Recording()
    batch_rescore(scorer, seqs, 3, seed=seed, alone=[[-1.0, -1.0]] * 7)
    order = list(range(7))
    random.Random(seed).shuffle(order)
    assert scorer.calls == [order[0:3], order[3:6], order[6:7]]


def test_max_abs_diff_is_the_largest_absolute_difference() -> None:
    got = BatchRescore(1, [[0.0, 1.0]], [[0.5, 0.75]], BitwiseEqual(0, 2))
    assert got.max_abs_diff == 0.5  # |0 - 0.5|, larger than |1 - 0.75|; not max(a - b) = 0.25


def test_k3_term_is_finite_up_to_the_largest_float64_exponent() -> None:
    assert k3_term(_LARGEST) == math.expm1(_LARGEST) - _LARGEST
    assert k3_term(math.nextafter(_LARGEST, math.inf)) == math.inf


def test_the_tensor_and_capped_k3_forms_agree_with_k3_term() -> None:
    """The one k3's forms: the tensor form is ``k3_term`` entry by entry, edges included (an
    infinite d and one past float64's ``expm1`` range give inf, NaN stays NaN); the capped form
    is ``k3_term`` up to ``EXPM1_CAP`` and stays finite above it (catches a form that drifts
    from the scalar one)."""
    ds = [0.0, -0.0, 1e-300, 1e-9, -0.5, 0.5, EXPM1_CAP, _LARGEST, 709.79, 1e9, -1e9]
    ds += [math.inf, -math.inf, math.nan]
    tensor = k3_terms(torch.tensor(ds, dtype=torch.float64)).tolist()
    for d, t in zip(ds, tensor, strict=True):
        want = k3_term(d)
        assert (math.isnan(t) and math.isnan(want)) or t == want, d
    for d in ds[:7]:
        assert capped_k3_term(d) == k3_term(d)
    assert capped_k3_term(1000.0) == math.expm1(EXPM1_CAP) - 1000.0
    assert math.isfinite(capped_k3_term(1e300))


def test_settings_defaults_and_switches() -> None:
    assert AttributionSettings().learning_rate == DEFAULT_LEARNING_RATE == 1e-6
    assert AttributionSettings(learning_rate=1.0).learning_rate == 1.0  # (0, 1]: 1 is in
    assert not RolloutSettings(top_k=-1).samples_differently  # -1 is vLLM's "off", as 0
    assert RolloutSettings(top_k=5).samples_differently
    for text in ("false", "False", "0", "no", "off"):
        assert parse_rollout(f"lm_head_fp32={text}").lm_head_fp32 is False


def test_each_cause_is_in_the_table_with_its_engines_spelling() -> None:
    assert tuple(CAUSE_TABLE) == CAUSES == (
        "dtype", "decode", "batch", "lm_head", "sampling", "rope", "kv_cache", "router",
        "stale_weights",
    )  # fmt: skip
    kv = CAUSE_TABLE["kv_cache"].fixes
    assert kv["vLLM"] == "--kv-cache-dtype auto" and kv["--rollout"] == "kv_cache_dtype=auto"
    assert kv["verl"] == "++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=auto"
    head = CAUSE_TABLE["lm_head"].fixes
    assert head["TRL"].startswith("cast_lm_head_to_fp32=True")
    assert head["SGLang"].startswith("--enable-fp32-lm-head")


def _row(share: float, in_total: bool = True) -> dict[str, object]:
    return {"share": share, "k3": 1e-3, "in_total": in_total}


def test_first_change_skips_the_dtype_outside_bfloat16_and_causes_of_no_share() -> None:
    # float32 alone: its dtype row is no setting to change (float16 is the remedy); kv_cache is.
    got = first_change({"float32": {"dtype": _row(0.9), "kv_cache": _row(0.1)}})
    assert got is not None and (got.dtype, got.cause) == ("float32", "kv_cache")
    assert first_change({"bfloat16": {"kv_cache": _row(0.0), "sampling": _row(-0.1)}}) is None
    got = first_change({"bfloat16": {"dtype": _row(0.7), "kv_cache": _row(0.2)}})
    assert got is not None and got.cause == "dtype"


def test_the_interval_cell_reads_value_low_high() -> None:
    row = {"k3": 1.5e-3, "k3_interval": [1.04e-3, 2.06e-3]}
    assert _interval(row["k3"], *row["k3_interval"]) == "1.50e-03 [1.0e-03, 2.1e-03]"
    assert _interval(None, None, None) == "- [-, -]"


def test_half_mean_square_is_half_the_mean_of_squares() -> None:
    assert _half_mean_sq([[1.0, -3.0], [2.0]]) == (1 + 9 + 4) / 3 / 2
    assert math.isnan(_half_mean_sq([[]]))


def test_the_trainer_divides_by_the_temperature_and_the_engine_masks_eos_before_min() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]])
    settings = RolloutSettings(temperature=0.5, logprobs_mode="processed_logprobs")
    trainer = trainer_transform(settings)(logits, None)
    assert torch.equal(trainer, (logits / 0.5).log_softmax(-1))
    engine = engine_transform(settings, 4, [3], 2, "cpu")
    # Completion positions 1 and 2 with min_new_tokens 2: EOS (id 3) is masked at 1 only.
    got = engine(logits.clone(), torch.tensor([1, 2]))
    assert got[0, 3] == -math.inf
    assert torch.equal(got[0, :3], (logits[0, :3] / 0.5).log_softmax(-1))
    assert torch.equal(got[1], (logits[1] / 0.5).log_softmax(-1))


def test_the_reports_evidence_carries_the_shares_not_the_parts() -> None:
    from precision_plugin.probe.attribution.decompose import K3
    from precision_plugin.probe.attribution.report import (
        AttributionReport,
        CauseRow,
        DtypeAttribution,
    )

    k3 = K3(1e-3, 5e-4, 2e-3)
    rows = [
        CauseRow("dtype", True, k3, part=2e-4, share=0.2, bitwise_equal=0.0, tokens=10),
        CauseRow("kv_cache", True, k3, part=8e-4, share=0.8, bitwise_equal=0.0, tokens=10),
    ]
    block = DtypeAttribution("bfloat16", k3, 1e-3, 0.0, 10, rows, 0.0, 0.0, {})
    report = AttributionReport(RolloutSettings(kv_cache_dtype="fp8"), 1e-6, {"bfloat16": block})
    report.first = first_change({"bfloat16": {r.cause: _row(r.share) for r in rows}})
    got = report.evidence()
    assert got is not None and (got.cause, got.share, got.dtype_share) == ("kv_cache", 0.8, 0.2)


def test_the_kv_cache_what_if_is_the_e4m3_cache_it_names() -> None:
    # On the same samples the what-if row (no fp8 cache in this rollout) equals the row of a
    # rollout that runs kv_cache_dtype=fp8_e4m3, bit for bit; e5m2 would give another value.
    from precision_plugin.probe.attribution.measure import attribute_dtype
    from tests.attribution_cases import NEW_TOKENS, llama, sample

    model = llama()
    samples = sample(model, "float32", RolloutSettings())
    rows = {}
    for settings, what_if in ((RolloutSettings(), True),
                              (RolloutSettings(kv_cache_dtype="fp8_e4m3"), False)):  # fmt: skip
        block = attribute_dtype(model, samples, "float32", settings,
                                min_new_tokens=NEW_TOKENS, learning_rate=None, what_if=what_if)  # fmt: skip
        rows[what_if] = block.row("kv_cache")
    hypothetical, switched = rows[True], rows[False]
    assert hypothetical is not None and switched is not None
    assert not hypothetical.in_total and switched.in_total
    assert "e4m3" in hypothetical.what_if
    assert hypothetical.k3.value == switched.k3.value
    # a what-if's part is its own k3; a cause in the total's is its Shapley part of the total
    assert hypothetical.part == hypothetical.k3.value > 0
    assert switched.split is not None and switched.part == switched.split.value


def test_the_batch_row_is_the_batched_scores_against_the_scores_alone() -> None:
    # A controlled engine rounds the final norm to bfloat16 whenever more than one sequence
    # shares the forward: the batch row is log p(batched) - log p(alone), on the rollout copy
    # with the trainer's kernels, scored here without the attribution's code. Its k3 is not
    # symmetric in the sides (a third-order term), so the sides swapped give another value.
    from precision_plugin._core.scoring import HFScorer
    from precision_plugin._core.scoring.interface import sequences_of
    from precision_plugin._core.scoring.packed_cpu import trainer_kernels
    from precision_plugin.probe.attribution.measure import _copy, attribute_dtype
    from tests.attribution_cases import NEW_TOKENS, BatchDependentNorm, llama, sample

    model = llama()
    model.model.norm.register_forward_hook(BatchDependentNorm())
    samples = sample(model, "float32", RolloutSettings())
    report = attribute_dtype(model, samples, "float32", RolloutSettings(),
                             min_new_tokens=NEW_TOKENS, learning_rate=None, what_if=False)  # fmt: skip
    row = report.row("batch")
    assert row is not None
    seqs = sequences_of(samples)
    copy = _copy(model, "float32")
    with trainer_kernels():
        alone = HFScorer(copy).score(seqs)
        # in the batches and order the attribution uses (seed 0: its default)
        batched = batch_rescore(
            HFScorer(copy, batch_size=len(seqs)), seqs, len(seqs), alone=alone
        ).batched
    d = [
        [b - a for b, a in zip(rb, ra, strict=True)] for rb, ra in zip(batched, alone, strict=True)
    ]
    swapped = [[-x for x in r] for r in d]
    tokens = sum(len(r) for r in d)
    expected = math.fsum(math.expm1(-x) + x for r in d for x in r) / tokens
    assert row.k3.value == pytest.approx(expected, rel=1e-12)
    assert row.k3.value != pytest.approx(
        math.fsum(math.expm1(-x) + x for r in swapped for x in r) / tokens, rel=1e-6
    )
    # its part is its Shapley part of the k3 total (tests/unit/test_attribution_shapley.py)
    assert row.split is not None and row.part == row.split.value
