"""The dose-response benchmark's parts: the injected noise, its measured variance, the summary.

The full benchmark (``tests/benchmarks/bench_dose_response.py``, about an hour) writes
``docs/results/dose-response.json``; here each part is checked against an independent
computation, and the whole script runs once at its smoke size.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from tests.benchmarks import bench_dose_response as bench


@pytest.fixture(scope="module")
def tiny():
    """The sanity benchmark's tiny Llama on the long task, untrained (seeded), and a prompt."""
    from precision_plugin.sanity.model import build_model
    from precision_plugin.sanity.schema import TASKS

    task = TASKS["long"]
    model, tokenizer = build_model("tiny", 0, task)
    prompt = tokenizer(task.make_problems(1, 0)[0].prompt, add_special_tokens=False)["input_ids"]
    return model.eval(), tokenizer, prompt


def _noisy_engine(model, sigma, noise_seed=0):
    from precision_plugin._core.hf_engine import HFRolloutEngine

    rollout = bench.NoisyRollout(sigma, noise_seed=noise_seed, dtype="float32")
    rollout.engine = HFRolloutEngine(model, "float32", "cpu")
    bench.add_noise(rollout.engine, rollout)
    rollout.recording = True
    return rollout


def test_at_sigma_zero_the_rollout_is_the_engine_unchanged(tiny):
    from precision_plugin._core.hf_engine import HFRolloutEngine

    model, _, prompt = tiny
    clean = HFRolloutEngine(model, "float32", "cpu").generate([prompt] * 3, 12, 7)
    noisy = _noisy_engine(model, 0.0).generate_batch([prompt] * 3, 12, 7)
    assert [s.completion_ids for s in noisy] == [s.completion_ids for s in clean]
    assert [s.logprobs for s in noisy] == [s.logprobs for s in clean]


def test_the_rollout_samples_from_the_logits_plus_sigma_z(tiny):
    """Each recorded log-prob is log_softmax(clean logits + sigma * z_t) at the sampled token,
    with z_t the t-th draw of the generator the benchmark seeds (one row, so no row leaves)."""
    import zlib

    model, _, prompt = tiny
    sigma, seed = 0.7, 11
    (sample,) = _noisy_engine(model, sigma, noise_seed=3).generate_batch([prompt], 10, seed)
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    generator = torch.Generator().manual_seed(zlib.crc32(f"3:{seed}".encode()))
    start = len(sample.prompt_ids) - 1
    for t, token in enumerate(sample.completion_ids):
        z = torch.randn((1, logits.shape[-1]), generator=generator, dtype=torch.float32)[0]
        expected = (logits[start + t] + sigma * z).log_softmax(-1)[token].item()
        assert sample.logprobs[t] == pytest.approx(expected, abs=2e-5)


def test_the_injected_variance_is_that_of_the_rescored_log_ratio_sums(tiny):
    model, _, prompt = tiny
    rollout = _noisy_engine(model, 0.5)
    samples = rollout.generate_batch([prompt] * 6, 10, 1)
    sums = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp = model(ids).logits[0].float().log_softmax(-1)
        start = len(s.prompt_ids) - 1
        clean = math.fsum(logp[start + t, c].item() for t, c in enumerate(s.completion_ids))
        sums.append(clean - math.fsum(s.logprobs))
    assert rollout.variances == [pytest.approx(statistics.pvariance(sums), rel=1e-4)]
    assert rollout.variances[0] > 0


def _run(seed, target, reward, accuracy, injected=0.0, ess=1.0):
    return {"seed": seed, "target_variance": target, "final_reward": reward,
            "eval_accuracy": accuracy, "injected_variance": injected, "mean_ess": ess,
            "sigma": 0.1 * target}  # fmt: skip


def test_a_dose_changes_a_figure_only_when_every_seed_moves_one_way_by_the_effect():
    runs = [
        _run(0, 0.0, 0.80, 0.90), _run(1, 0.0, 0.70, 0.80),
        # every seed lower, by 0.10 and 0.02: mean 0.06 >= EFFECT (0.05)
        _run(0, 1.0, 0.70, 0.88, 1.1, 0.4), _run(1, 1.0, 0.68, 0.84, 0.9, 0.5),
        # larger mean drop, but one seed higher: not a change
        _run(0, 4.0, 0.50, 0.60, 4.0, 0.1), _run(1, 4.0, 0.75, 0.81, 4.2, 0.1),
    ]  # fmt: skip
    rows = bench.summarize(runs, [0.0, 1.0, 4.0])
    assert [r["final_reward_changed"] for r in rows] == [False, True, False]
    assert [r["eval_accuracy_changed"] for r in rows] == [False, False, False]
    assert rows[1]["final_reward_difference"] == pytest.approx(-0.06)
    assert rows[1]["eval_accuracy_difference"] == pytest.approx(0.01)
    assert rows[1]["injected_variance"] == pytest.approx(1.0)
    assert rows[1]["mean_ess"] == pytest.approx(0.45)
    # the smaller dose moved the reward, the larger did not: the seeds' spread, no threshold
    assert bench.threshold(rows, "final_reward") is None
    assert bench.threshold(rows, "eval_accuracy") is None


def test_the_threshold_is_where_the_effect_persists_through_every_larger_dose():
    runs = [
        _run(0, 0.0, 0.80, 0.90), _run(1, 0.0, 0.70, 0.80),
        _run(0, 0.5, 0.70, 0.90, 0.5, 0.6), _run(1, 0.5, 0.69, 0.80, 0.5, 0.6),  # -0.055
        _run(0, 1.0, 0.79, 0.90, 1.1, 0.4), _run(1, 1.0, 0.69, 0.80, 0.9, 0.5),  # -0.01
        _run(0, 2.0, 0.70, 0.90, 2.0, 0.2), _run(1, 2.0, 0.60, 0.80, 2.0, 0.2),  # -0.10
        _run(0, 4.0, 0.50, 0.90, 4.0, 0.1), _run(1, 4.0, 0.40, 0.80, 4.2, 0.1),  # -0.30
    ]  # fmt: skip
    rows = bench.summarize(runs, [0.0, 0.5, 1.0, 2.0, 4.0])
    assert [r["final_reward_changed"] for r in rows] == [False, True, False, True, True]
    assert bench.threshold(rows, "final_reward") == {
        "target_variance": 2.0, "injected_variance": pytest.approx(2.0),
        "mean_ess": pytest.approx(0.2)}  # fmt: skip


def test_the_benchmark_runs_end_to_end_at_its_smoke_size(tmp_path):
    """The real path (pretraining, calibration, GRPO with TRL, evaluation, JSON, figure) at
    3 steps, one seed and one dose."""
    out, figure = tmp_path / "dose.json", tmp_path / "dose.png"
    assert bench.main(["--smoke", "--variances", "0.5", "--eval-samples", "1",
                       "--json", str(out), "--plot", str(figure)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert [d["target_variance"] for d in data["doses"]] == [0.0, 0.5]
    control, dose = data["runs"]
    assert control["sigma"] == 0.0 and control["injected_variance"] == 0.0
    assert dose["sigma"] > 0 and dose["injected_variance"] > 0
    assert dose["mean_ess"] < control["mean_ess"]
    assert len(dose["reward"]) == data["steps"] == 3
    assert data["provenance"]["command"].startswith(".venv/bin/python -m tests.benchmarks")
    assert figure.stat().st_size > 0
