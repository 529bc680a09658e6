"""Values pinned where a test used to check only a range or a single case, so a one-line change
there fails a test (the sites where planted bugs survived, issue 31): the projection interval's z
against its stated coverage, the boundary's integer validators on float-typed parameters, an
``https://`` server URL, the sanity run's vLLM settings, its pairing of dtypes by seed and its
majority verdict with an even number of seeds, and the layer-wise probe's parting rule."""

from __future__ import annotations

import math
from statistics import NormalDist
from types import SimpleNamespace

import pytest

from precision_plugin._base.boundary import Invalid, at_least, in_range
from precision_plugin._core.metrics.consequence import (
    COVERAGE,
    TRL_SEQUENCE_MASK,
    fit_growth,
    mask_fraction,
    project,
)
from precision_plugin._core.sampling import SamplingSettings
from precision_plugin._core.serving import url_problem
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.layerwise import PART_FACTOR, StageDivergence, outliers

# -- the projection's intervals: z from the stated coverage -----------------------------------


def _z() -> float:
    """The two-sided normal quantile of ``COVERAGE``, computed here (not the module's constant)."""
    return NormalDist().inv_cdf((1 + COVERAGE) / 2)


def test_the_stated_coverage_is_ninety_percent():
    assert COVERAGE == 0.90
    assert fit_growth([0.1, -0.2, 0.3], [10, 20, 30]).to_dict()["coverage"] == 0.90


def test_the_drift_interval_is_z_standard_errors_of_the_stated_coverage():
    """TRL's mask (w <= 3) is one-sided: its share is monotone in the drift and, for a given
    drift, in the variance, so the interval's ends are corners of the box: drift -/+ z standard
    errors, the ends of the variance interval the projection uses (the heavy-tail one, issue
    32, where it is finite)."""
    fit = fit_growth([0.2, -0.3, 0.1, 0.4, -0.1], [100, 200, 300, 400, 500])
    assert math.isfinite(fit.variance_robust_low) and math.isfinite(fit.variance_robust_high)
    assert fit.variance_robust_high > fit.variance_high  # the heavy-tail interval is the wider

    def ends(z: float) -> tuple[float, float]:
        corners = [
            mask_fraction(TRL_SEQUENCE_MASK, fit.drift + sign * z * fit.drift_stderr, v, 4096)
            for sign in (-1, 1)
            for v in (fit.variance_robust_low, fit.variance_robust_high)
        ]
        return min(corners), max(corners)

    p = project(fit, 4096)
    low, high = ends(_z())
    assert p.seq_mask_fraction_trl.low == pytest.approx(low, rel=1e-9)
    assert p.seq_mask_fraction_trl.high == pytest.approx(high, rel=1e-9)
    # The z of another coverage (95 %: 1.96) gives visibly different ends.
    assert ends(1.96)[0] != pytest.approx(low, rel=1e-3)


def test_the_share_interval_is_clopper_pearson_at_the_stated_coverage():
    """The clip share's interval is the exact binomial one (issue 32), from the beta quantiles
    computed here: a Wilson or normal interval, or another coverage, fails."""
    from scipy.stats import beta

    fit = fit_growth([0.1, -0.2, 0.3, 0.0], [250, 250, 250, 250], clipped_tokens=3)
    n, k, tail = 1000, 3, (1 - COVERAGE) / 2
    assert fit.tis_clip.value == 0.003
    assert fit.tis_clip.low == pytest.approx(beta.ppf(tail, k, n - k + 1), rel=1e-9)
    assert fit.tis_clip.high == pytest.approx(beta.ppf(1 - tail, k + 1, n - k), rel=1e-9)


# -- the boundary's integer validators against float-typed parameters --------------------------


def test_an_integer_validator_refuses_a_float_even_a_whole_one():
    for check in (at_least(0), in_range(0, 10, integer=True)):
        assert check(3) == 3
        for value in (3.0, 2.5):
            with pytest.raises(Invalid, match="not a fraction"):
                check(value)


def test_a_number_validator_takes_fractions_and_integers():
    for check in (at_least(0, integer=False), in_range(-2.0, 2.0)):
        assert check(1.5) == 1.5 and check(1) == 1
        with pytest.raises(Invalid, match="out of range"):
            check(-2.5)


def test_float_typed_sampling_settings_take_fractions_and_top_k_does_not():
    s = SamplingSettings(temperature=0.7, top_p=0.95, min_p=0.05, repetition_penalty=1.1,
                         frequency_penalty=0.5, presence_penalty=-1.5, top_k=20)  # fmt: skip
    assert (s.min_p, s.frequency_penalty, s.presence_penalty) == (0.05, 0.5, -1.5)
    for bad in (2.0, 2.5):
        with pytest.raises(PrecisionConfigError, match="top_k"):
            SamplingSettings(top_k=bad)


# -- server URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://vllm.example.org", None),
        ("https://10.0.0.5:8443", None),
        ("HTTPS://h:8000", None),
        ("http://localhost:8000", None),
        ("ftp://h:8000", "scheme 'ftp'"),
        ("localhost:8000", "no http:// or https:// scheme"),
        ("https://", "no host"),
    ],
)
def test_server_urls_with_either_scheme(url, problem):
    assert url_problem(url) == problem


# -- the sanity run: vLLM settings, pairing by seed, majority verdict --------------------------


def test_the_sanity_run_gives_trl_vllm_plain_policy_gradient(monkeypatch, tmp_path):
    """With the vLLM engine: colocated vLLM, no importance-sampling correction (as with the HF
    rollout), exactly these settings, each a field TRL's GRPOConfig has."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    import precision_plugin.sanity.run as run_module
    from precision_plugin.sanity import preset_config
    from tests.tiny import tiny_llama

    seen = {}

    def capture(config, seed, model, tokenizer, problems, output_dir, extra, rollout_func, cbs):
        seen.update(seed=seed, extra=extra, rollout_func=rollout_func)
        raise _Stop

    monkeypatch.setattr(run_module, "_trainer", capture)
    tokenizer = SimpleNamespace(save_pretrained=lambda folder: None)
    config = preset_config("default", smoke=True, engine="vllm")
    with pytest.raises(_Stop):
        run_module._build_trainer(config, 7, "float16", tiny_llama(), tokenizer, [],
                                  str(tmp_path), lambda *a: None)  # fmt: skip
    assert seen["extra"] == {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.3,
        "vllm_importance_sampling_correction": False,
    }
    assert seen["seed"] == 7 and seen["rollout_func"] is None
    assert set(seen["extra"]) <= set(GRPOConfig.__dataclass_fields__)


class _Stop(Exception):
    pass


def test_the_sanity_run_pairs_the_dtypes_of_a_seed(monkeypatch):
    """Within a seed every dtype starts from the seed's own model and problems with the seed's
    sampling seed; the next seed pretrains its own."""
    import precision_plugin.sanity.run as run_module
    from precision_plugin.sanity import DtypeRun, preset_config
    from tests.tiny import tiny_llama

    models = {}

    def pretrained(config, seed, report):
        models[seed] = (tiny_llama(), [f"problem {seed}"])
        return models[seed][0], ["token"] * 64, models[seed][1], {}  # a "tokenizer" of 64

    calls = []

    def run_dtype(config, seed, dtype, model, tokenizer, problems, report):
        calls.append((seed, dtype, model, problems))
        return DtypeRun(dtype=dtype, steps=[], seconds=0.0, cpu_seconds=0.0)

    monkeypatch.setattr(run_module, "_pretrained", pretrained)
    monkeypatch.setattr(run_module, "_run_dtype", run_dtype)
    config = preset_config("default", smoke=True, seeds=(3, 5))
    result = run_module.run_sanity(config)
    dtypes = list(config.dtypes)
    assert [(s, d) for s, d, _, _ in calls] == [(s, d) for s in (3, 5) for d in dtypes]
    for seed, _, model, problems in calls:
        assert model is models[seed][0] and problems is models[seed][1]
    assert models[3][0] is not models[5][0]
    assert [s.seed for s in result.seeds] == [3, 5]


def _seed_run(seed, degraded_dtypes):
    """A seed whose dtypes in ``degraded_dtypes`` end 0.25 below float32 (others level)."""

    def run(final):
        return SimpleNamespace(summary={"final_accuracy": final, "collapsed": False})

    runs = {"float32": run(0.75)}
    for d in ("float16", "bfloat16"):
        runs[d] = run(0.5 if d in degraded_dtypes else 0.75)
    return SimpleNamespace(seed=seed, runs=runs)


@pytest.mark.parametrize(("hits", "degrades"), [(1, False), (2, False), (3, True), (4, True)])
def test_the_verdict_needs_more_than_half_of_an_even_number_of_seeds(hits, degrades):
    from precision_plugin.sanity import preset_config
    from precision_plugin.sanity.aggregate import verdict

    seeds = [_seed_run(i, {"bfloat16"} if i < hits else set()) for i in range(4)]
    config = preset_config("default", smoke=True, seeds=(0, 1, 2, 3))
    out = verdict(SimpleNamespace(config=config, seeds=seeds))
    assert out["dtypes"]["bfloat16"] == {"degraded_seeds": list(range(hits)), "degrades": degrades}
    assert out["dtypes"]["float16"] == {"degraded_seeds": [], "degrades": False}
    assert out["paper_consequence_reproduced"] is degrades


# -- the layer-wise probe: where the sides part ------------------------------------------------


def _stages(*local_units):
    return [StageDivergence(f"model.layers.{i}", "Layer", u, u) for i, u in enumerate(local_units)]


def test_two_stages_standing_out_part_at_the_first_in_forward_order():
    stages = _stages(0.5, 0.5, 30.0, 0.5, 10.0, 0.5)
    assert outliers(stages) == ["model.layers.2", "model.layers.4"]
    stages = _stages(0.5, 0.5, 10.0, 0.5, 30.0, 0.5)  # the larger second: still the first
    assert outliers(stages) == ["model.layers.2", "model.layers.4"]


def test_parting_needs_part_factor_times_the_median():
    assert PART_FACTOR == 4.0
    assert outliers(_stages(2.0, 2.0, 2.0, 8.0)) == []  # exactly 4x the median: not above
    assert outliers(_stages(2.0, 2.0, 2.0, 8.001)) == ["model.layers.3"]


def test_parting_needs_more_than_one_rounding_unit():
    """A stage far above a tiny median but within one rounding unit does not part."""
    assert outliers(_stages(0.01, 0.01, 0.01, 1.0)) == []
    assert outliers(_stages(0.01, 0.01, 0.01, 1.001)) == ["model.layers.3"]
    assert outliers(_stages(0.01, 0.01, 0.01, math.nan)) == ["model.layers.3"]


# -- the batch ESS: the log-ratio's spread is sqrt(variance * length) ---------------------------


def test_the_batch_ess_of_a_large_batch_is_the_lognormal_limit():
    """For N sequences with log-ratios ~ Normal(0, v·L), E[ESS] -> exp(−v·L) as N grows (the
    lognormal weights' E[w]²/E[w²]). Seeded Monte Carlo of 4,096-sequence batches: the two cases
    sit within 2e-3 of the limit; a spread of v·L or v/L instead of its square root (a surviving
    mutant of issue 31) moves the first by 0.16 and the second by 0.63."""
    from precision_plugin._core.intervals import batch_ess

    assert batch_ess(0.00025, 1000, 4096) == pytest.approx(math.exp(-0.25), abs=6e-3)
    assert batch_ess(0.001, 1000, 4096) == pytest.approx(math.exp(-1.0), abs=6e-3)
    assert batch_ess(0.00025, 1000, 1) == 1.0  # one sequence keeps itself whole
    assert batch_ess(0.0, 1000, 64) == 1.0  # no spread, equal weights
