"""Where the consequence matters: GRPO reward against the mismatch injected into the rollout.

The sanity benchmark's long-horizon task (``--preset long``: continue an 8-letter key for 96
letters, each shifted by 3 or 4) on its small Llama, GRPO with TRL's ``GRPOTrainer`` and
``HFRollout``, both sides in float32 so the engines themselves agree (k3 ~1e-13). The mismatch
is then injected: the rollout samples from its logits plus ``sigma * z`` (``z`` standard normal,
fresh for every token and vocabulary entry, seeded), so the behaviour policy differs from the
trained one as a lower-precision engine's does, and the trainer learns from those samples
without a correction (plain policy gradient, as in the paper's sanity runs). Per dose:

- the **injected variance**: the variance over a batch of the per-sequence log-ratio sums
  ``sum_t log pi_train(y_t) - log pi_rollout(y_t)``, each rollout batch rescored by the clean
  float32 copy, averaged over the run; and the plugin's own batch ESS (``precision/ess``), the
  figure the probe's verdicts read (noticeable >= 0.5, costly >= 0.3, severe below);
- the **training reward**: the mean exact-answer reward of the last sixth of the steps (what
  TRL logs, sampled by the noisy rollout);
- the **learned policy**: the exact-answer accuracy of the final float32 policy sampled
  without noise (``--eval-samples`` samples per problem), i.e. what training achieved.

Each dose runs ``--seeds`` seeds, paired with the control (no noise) of the same seed: same
pretrained weights, same problems and trainer seed. A dose *changes the reward* when every
seed's paired difference has the same sign and their mean is at least ``EFFECT`` (5 points);
the threshold is the smallest dose from which every larger dose changes it too.
``sigma`` for each target variance is found per seed on its pretrained model (bisection in
``log sigma`` on rescored rollout batches), so the doses are in the unit the verdicts use.

    .venv/bin/python -m tests.benchmarks.bench_dose_response [--smoke] [--json F] [--plot P]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.benchmarks.report import add_json_option, write_json

#: Target per-sequence log-ratio variances (0: the control). exp(-v) is the lognormal ESS: 1,
#: 0.90 (noticeable), 0.50 (noticeable/costly), 0.14 and 0.002 (severe).
VARIANCES: tuple[float, ...] = (0.0, 0.1, 0.7, 2.0, 6.0)
#: A paired difference in reward or accuracy this large (and of one sign over the seeds) is
#: an effect of the dose.
EFFECT = 0.05
#: The learning rate: the highest of the sanity learning-rate sweep
#: (``docs/results/sanity-long-lr.json``) at which float32 rose steadily (0.49 -> 0.90 over
#: 300 steps) without the dip 1e-3 showed.
LEARNING_RATE = 3e-4
#: Batches of rollouts the bisection rescores per candidate sigma.
CALIBRATION_ROUNDS = 2


class NoisyRollout:
    """``HFRollout`` whose engine samples from ``logits + sigma * z``, recording the variance
    over each batch of the per-sequence log-ratio (clean minus noisy, at the sampled tokens).

    ``noise_seed`` seeds the noise of each call (with the call's own sampling seed), so a run
    is reproducible. The recorded log-probs are the noisy distribution's (what the rollout
    sampled from), as an engine reports its own.
    """

    def __new__(cls, sigma: float, noise_seed: int = 0, **kwargs: Any) -> Any:
        from precision_plugin.trl import HFRollout

        class _Noisy(HFRollout):
            def __init__(self) -> None:
                super().__init__(**kwargs)
                self.sigma = sigma
                self.variances: list[float] = []
                self.recording = False
                self._noise: Any = None

            def generate_batch(self, prompts: Any, max_tokens: int, seed: int, *,
                               sampling: Any = None) -> list[Any]:  # fmt: skip
                import torch

                if self.sigma <= 0:
                    return super().generate_batch(prompts, max_tokens, seed, sampling=sampling)
                self._noise = torch.Generator().manual_seed(
                    zlib.crc32(f"{noise_seed}:{seed}".encode())
                )
                samples = super().generate_batch(prompts, max_tokens, seed, sampling=sampling)
                if self.recording:
                    self.variances.append(log_ratio_variance(self.engine.model, samples))
                return samples

            def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
                # The trainer's rollout batch is measured; the canary's probes of the same
                # engine (one sequence at a time, a batch of 16) sample with noise too.
                self.recording = True
                try:
                    return super().__call__(prompts, trainer)
                finally:
                    self.recording = False

            def _sync(self, trainer: Any) -> None:
                fresh = self.engine is None
                super()._sync(trainer)
                if fresh:
                    add_noise(self.engine, self)

        return _Noisy()


def add_noise(engine: Any, rollout: Any) -> None:
    """Make ``engine`` sample from its logits plus ``rollout.sigma * z`` (``z`` from
    ``rollout._noise``); at ``sigma`` 0 it is left as it is."""
    forward = engine._forward

    def noisy(*args: Any) -> tuple[Any, Any]:
        import torch

        logits, past = forward(*args)
        if rollout.sigma <= 0:
            return logits, past
        z = torch.randn(logits.shape, generator=rollout._noise, dtype=torch.float32)
        return logits.float() + rollout.sigma * z, past

    engine._forward = noisy


def log_ratio_variance(model: Any, samples: Sequence[Any]) -> float:
    """The variance over ``samples`` of ``sum_t log p_model(y_t) - logprob_t`` (the samples'
    recorded log-probs), ``model`` scoring each completion in float32 with a full forward."""
    from precision_plugin._core.scoring.hf import HFScorer
    from precision_plugin._core.scoring.interface import sequences_of

    clean = HFScorer(model, batch_size=len(samples)).score(sequences_of(samples))
    sums = [math.fsum(c) - math.fsum(s.logprobs) for c, s in zip(clean, samples, strict=True)]
    return statistics.pvariance(sums) if len(sums) > 1 else 0.0


def calibrate(model: Any, tokenizer: Any, problems: Sequence[Any], task: Any, target: float,
              seed: int, batch: int) -> float:  # fmt: skip
    """The ``sigma`` whose rollouts of ``model`` have per-sequence log-ratio variance
    ``target`` (bisection on ``log sigma``, 10 halvings between 1e-4 and 30)."""
    if target <= 0:
        return 0.0
    from precision_plugin._core.hf_engine import HFRolloutEngine

    rollout = NoisyRollout(1.0, noise_seed=seed, dtype="float32")
    rollout.engine = HFRolloutEngine(model, "float32", "cpu")
    add_noise(rollout.engine, rollout)
    prompts = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    low, high = math.log(1e-4), math.log(30.0)
    for _ in range(10):
        mid = (low + high) / 2
        rollout.sigma = math.exp(mid)
        measured = statistics.fmean(
            _calibration_round(rollout, prompts, task, seed + r, batch)
            for r in range(CALIBRATION_ROUNDS)
        )
        low, high = (mid, high) if measured < target else (low, mid)
    return math.exp((low + high) / 2)


def _calibration_round(rollout: Any, prompts: Sequence[Any], task: Any, seed: int,
                       batch: int) -> float:  # fmt: skip
    import random

    chosen = random.Random(seed).sample(list(prompts), min(batch, len(prompts)))
    rollout.variances.clear()
    rollout.recording = True
    rollout.generate_batch(chosen, task.max_completion_tokens, seed)
    return rollout.variances[-1]


def run_dose(config: Any, seed: int, sigma: float, pretrained: Any, tokenizer: Any,
             problems: Sequence[Any], eval_samples: int) -> dict[str, Any]:  # fmt: skip
    """One GRPO run at noise ``sigma`` from ``pretrained``: per-step records, the injected
    variance and the final policy's clean accuracy."""
    import copy

    import precision_plugin as pp
    from precision_plugin.sanity.pretrain import sampled_accuracy
    from precision_plugin.sanity.run import _record, _trainer

    wall = time.perf_counter()
    rollout = NoisyRollout(sigma, noise_seed=seed, dtype="float32")
    pp.enable(dtype="float32")
    try:
        with tempfile.TemporaryDirectory(prefix="precision-dose-") as out:
            trainer = _trainer(config, seed, copy.deepcopy(pretrained), tokenizer, list(problems),
                               out, {}, rollout, [])  # fmt: skip
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
            trainer.train()
            history = [_record(h) for h in trainer.state.log_history if "loss" in h]
            policy = trainer.accelerator.unwrap_model(trainer.model)
            accuracy = statistics.fmean(
                sampled_accuracy(policy, config.task, tokenizer, problems, 10_000 + seed * 100 + k)
                for k in range(eval_samples)
            )
    finally:
        pp.disable()
    window = history[-config.window :]
    ess = [s.telemetry.get("ess") for s in history if s.telemetry.get("ess") is not None]
    return {
        "seed": seed,
        "sigma": sigma,
        "injected_variance": statistics.fmean(rollout.variances) if rollout.variances else 0.0,
        "mean_ess": statistics.fmean(ess) if ess else None,
        "mean_k3_kl": statistics.fmean(s.k3_kl for s in history if s.k3_kl is not None),
        "first_reward": statistics.fmean(s.reward for s in history[: config.window]),
        "final_reward": statistics.fmean(s.reward for s in window),
        "eval_accuracy": accuracy,
        "reward": [s.reward for s in history],
        "seconds": time.perf_counter() - wall,
    }


def summarize(runs: Sequence[dict[str, Any]], targets: Sequence[float]) -> list[dict[str, Any]]:
    """Per target: the mean injected variance and ESS, the rewards and the paired differences
    from the control, and whether the dose changes the reward or the learned accuracy."""
    control = {r["seed"]: r for r in runs if r["target_variance"] == 0.0}
    rows = []
    for target in targets:
        mine = [r for r in runs if r["target_variance"] == target]
        row: dict[str, Any] = {
            "target_variance": target,
            "injected_variance": statistics.fmean(r["injected_variance"] for r in mine),
            "mean_ess": _mean(r["mean_ess"] for r in mine),
            "sigma": [r["sigma"] for r in mine],
        }
        for name in ("final_reward", "eval_accuracy"):
            diffs = [r[name] - control[r["seed"]][name] for r in mine if r["seed"] in control]
            row[name] = statistics.fmean(r[name] for r in mine)
            row[name + "_by_seed"] = [r[name] for r in mine]
            row[name + "_difference"] = statistics.fmean(diffs) if diffs else None
            row[name + "_changed"] = (
                bool(diffs)
                and target > 0
                and (
                    (all(d < 0 for d in diffs) or all(d > 0 for d in diffs))
                    and abs(statistics.fmean(diffs)) >= EFFECT
                )
            )
        rows.append(row)
    return rows


def _mean(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.fmean(found) if found else None


def threshold(rows: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The smallest dose from which ``name`` is changed at every larger dose too (a dose-response
    persists as the dose grows: a dose that moves the figure while larger ones do not is the
    seeds' spread), with its injected variance and ESS; ``None`` when the largest dose does not
    change it."""
    doses = [row for row in rows if row["target_variance"] > 0]
    found = None
    for row in reversed(doses):
        if not row[name + "_changed"]:
            break
        found = row
    if found is None:
        return None
    return {key: found[key] for key in ("target_variance", "injected_variance", "mean_ess")}


def plot(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Reward and learned accuracy against the injected variance, one dot per seed, with the
    verdicts' ESS thresholds as lognormal variances (v = -ln ESS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floor = min((r["injected_variance"] for r in rows if r["target_variance"] > 0), default=1e-3)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, colour, label in (("final_reward", "tab:blue", "training reward (last sixth)"),
                                ("eval_accuracy", "tab:orange", "learned policy, sampled clean")):  # fmt: skip
        xs = [max(r["injected_variance"], floor / 10) for r in rows]
        ax.plot(xs, [r[name] for r in rows], "-", color=colour, label=label)
        for x, r in zip(xs, rows, strict=True):
            ax.plot([x] * len(r[name + "_by_seed"]), r[name + "_by_seed"], "o", color=colour,
                    alpha=0.5, markersize=4)  # fmt: skip
    for ess, text in ((0.99, "negligible"), (0.5, "noticeable"), (0.3, "costly")):
        ax.axvline(-math.log(ess), color="grey", linestyle=":", linewidth=1)
        ax.text(-math.log(ess), 1.02, text, rotation=90, fontsize=7, va="bottom", ha="right",
                transform=ax.get_xaxis_transform())  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("injected per-sequence log-ratio variance (control at the left)")
    ax.set_ylabel("exact-answer reward")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default 200)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2")
    parser.add_argument("--variances", type=float, nargs="+", default=list(VARIANCES))
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="a CI-sized run of the same path")
    parser.add_argument("--plot", default=None, help="write the figure here (PNG)")
    parser.add_argument(
        "--summarize",
        default=None,
        metavar="FILE",
        help="summarize the runs of an earlier results file again (no training)",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    from precision_plugin.sanity.run import _one_thread, _pretrained
    from precision_plugin.sanity.schema import preset_config

    if args.summarize:
        return _summarize_again(args, argv)
    variances = sorted({0.0, *args.variances})
    steps, seeds = args.steps, args.seeds
    if not args.smoke:
        steps, seeds = steps or 200, seeds or [0, 1, 2]
    config = preset_config("long", smoke=args.smoke, steps=steps, seeds=seeds and tuple(seeds),
                           learning_rate=LEARNING_RATE, dtypes=("float32",))  # fmt: skip
    start = time.perf_counter()
    runs = []
    with _one_thread():
        pretrained = {seed: _pretrained(config, seed, lambda *_: None) for seed in config.seeds}
        batch = config.prompts_per_step * config.num_generations
        done: list[float] = []
        # Dose by dose, every seed of one before the next (the control first, then the largest
        # dose, then the rest): a run stopped early still has whole doses, all written.
        for target in _dose_order(variances):
            for seed in config.seeds:
                model, tokenizer, problems, info = pretrained[seed]
                sigma = calibrate(model, tokenizer, problems, config.task, target, seed, batch)
                run = run_dose(config, seed, sigma, model, tokenizer, problems, args.eval_samples)
                run |= {"target_variance": target, "pretrain_accuracy": info["sampled_accuracy"]}
                runs.append(run)
                print(f"seed {seed} v={target:<5g} sigma={sigma:.4f} injected="
                      f"{run['injected_variance']:.3g} ess={run['mean_ess'] or math.nan:.3f} "
                      f"reward {run['first_reward']:.2f}->{run['final_reward']:.2f} "
                      f"eval {run['eval_accuracy']:.2f} ({run['seconds']:.0f} s)", flush=True)  # fmt: skip
            done.append(target)
            rows = _report(config, runs, sorted(done), variances, start, args, argv)
    for row in rows:
        print(f"v={row['target_variance']:<5g} injected {row['injected_variance']:.3g} "
              f"ess {row['mean_ess'] or math.nan:.3f} reward {row['final_reward']:.3f} "
              f"({row['final_reward_difference'] or 0:+.3f}) eval {row['eval_accuracy']:.3f} "
              f"({row['eval_accuracy_difference'] or 0:+.3f})")  # fmt: skip
    return 0


def _summarize_again(args: Any, argv: list[str] | None) -> int:
    """Summarize an earlier results file's runs with this code's rule (its runs kept as they
    are, its configuration read from it) and write the results and the figure."""
    import json
    import types

    old = json.loads(Path(args.summarize).read_text())
    config = types.SimpleNamespace(
        steps=old["steps"], seeds=old["seeds"], learning_rate=old["learning_rate"],
        window=old["window"],
    )  # fmt: skip
    done = sorted({r["target_variance"] for r in old["runs"]})
    variances = old.get("planned_variances", done)
    args.smoke = old.get("smoke", False)
    rows = _report(config, old["runs"], done, variances, time.perf_counter() - old["seconds"],
                   args, argv)  # fmt: skip
    for row in rows:
        print(f"v={row['target_variance']:<5g} reward {row['final_reward_difference'] or 0:+.3f} "
              f"eval {row['eval_accuracy_difference'] or 0:+.3f}")  # fmt: skip
    return 0


def _dose_order(variances: Sequence[float]) -> list[float]:
    """The control, the largest dose, then the others from the largest down."""
    rest = sorted((v for v in variances if v > 0), reverse=True)
    return [0.0, *rest]


def _report(config: Any, runs: list[dict[str, Any]], done: list[float], variances: list[float],
            start: float, args: Any, argv: list[str] | None) -> list[dict[str, Any]]:  # fmt: skip
    """Summarize the doses run so far and write the results (and the figure)."""
    rows = summarize(runs, done)
    data = {
        "task": "long",
        "steps": config.steps,
        "seeds": list(config.seeds),
        "learning_rate": config.learning_rate,
        "window": config.window,
        "effect": EFFECT,
        "rule": (
            f"a dose changes a figure when every seed's paired difference from the "
            f"control has one sign and their mean is at least {EFFECT}; the threshold is the "
            f"smallest dose from which every larger dose changes it too"
        ),
        "doses": rows,
        "runs": runs,
        "planned_variances": variances,
        "complete": len(done) == len(variances),
        "reward_threshold": threshold(rows, "final_reward"),
        "accuracy_threshold": threshold(rows, "eval_accuracy"),
        "seconds": time.perf_counter() - start,
        "smoke": args.smoke,
    }
    if args.plot:
        plot(rows, args.plot)
    write_json(args.json, data, "tests.benchmarks.bench_dose_response", argv=argv)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
