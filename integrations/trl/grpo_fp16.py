"""GRPO in consistent FP16 with precision_plugin: a runnable recipe (CPU is enough).

    python integrations/trl/grpo_fp16.py --max-steps 3
    python integrations/trl/grpo_fp16.py --max-steps 3 --dtype bfloat16   # same seed, bf16
    python integrations/trl/grpo_fp16.py --max-steps 3 --entry callback   # PrecisionCallback alone

By default everything is built in code (a tiny Llama, a character tokenizer, a toy prompt set
and reward), so nothing is downloaded, and rollouts come from ``HFRollout`` (the plugin's HF
engine, an inference copy of the policy in the policy dtype). Each step prints the
train/rollout mismatch the plugin logs (``precision/k3_kl``, ...), then the asked-vs-ran table
and one JSON line with the loss scale, what ran and the mean mismatch (``--json FILE`` also
writes all of it, with the command that produced it). ``--entry callback`` uses
``PrecisionCallback(dtype)`` without ``enable()``: the flags are set by hand, and on a CPU the
learner then runs float32 (Accelerate has no fp16 there), which the callback reports.
Fire drills for the drift canary (docs/canary.md): ``--drill stale-weights@STEP`` freezes
the rollout copy's weights from STEP on (a weight sync that silently fails), ``--drill
engine-drift@STEP`` perturbs the rollout copy a little more at each step from STEP on (run it
with ``--learning-rate 0``, so the learner stands still), ``--drill batch-drift@STEP`` adds
growing noise to the rollout log-probs the batch reports while the engine itself is untouched
(the per-batch mismatch grows, the canary holds: the ``policy_moving`` note, no alarm);
``--canary-every K`` checks the canary
every K steps and ``--rollout-batch 1`` makes HFRollout sample and score one sequence at a time
(batch-invariant: precision level 2).
``--model PATH`` trains a local checkpoint (loaded in float32: the plugin keeps master weights
fp32 and autocast computes in the policy dtype); ``--engine vllm-colocate`` / ``--engine
vllm-server`` sample with vLLM instead (GPU; the plugin starts a colocated engine in the policy
dtype; a server must run with ``PRECISION_PLUGIN=<dtype>``).
"""

from __future__ import annotations

import argparse
import json
import os
import string
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

import precision_plugin as pp
from precision_plugin import PrecisionCallback
from precision_plugin.cli.argtypes import non_negative_float, non_negative_int, positive_int
from precision_plugin.probe.inputs import check_model_dir

ALPHABET = string.ascii_lowercase + " "


def build_model_and_tokenizer(seed: int = 0) -> tuple[Any, Any]:
    """A 1-layer Llama and a character-level tokenizer, built in code."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{c: i + 3 for i, c in enumerate(ALPHABET)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config), tokenizer


#: Relative size of the engine-drift drill's perturbation, per step since it started.
DRIFT_PER_STEP = 5e-4
#: Standard deviation (nats) of the batch-drift drill's noise, per step since it started.
BATCH_DRIFT_PER_STEP = 1e-3


class DrillRollout:
    """``HFRollout`` with a fault injected from ``at`` on (a fire drill for the canary).

    ``stale-weights``: the rollout copy stops taking the learner's weights (its refresh is
    skipped). ``engine-drift``: after each refresh, every floating weight of the rollout copy is
    multiplied by ``1 + DRIFT_PER_STEP * k * z`` (``z`` standard normal, seeded by the step,
    ``k`` the steps since ``at``, counting from 1): a little more drift at each step.
    ``batch-drift``: the log-probs a rollout batch reports get ``BATCH_DRIFT_PER_STEP * k * z``
    added (the engine and its scoring path untouched): the per-batch mismatch grows while the
    canary holds, as when the policy moves into tokens the engines disagree on more.
    """

    def __new__(cls, kind: str, at: int, **kwargs: Any) -> Any:
        from precision_plugin.trl import HFRollout

        class _Drill(HFRollout):
            def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
                out = super().__call__(prompts, trainer)
                step = trainer.state.global_step + 1  # the step this batch is logged at
                if kind == "batch-drift" and step >= at:
                    generator = torch.Generator().manual_seed(10_000 + step)
                    scale = BATCH_DRIFT_PER_STEP * (step - at + 1)
                    out["logprobs"] = [
                        [lp + scale * float(torch.randn((), generator=generator)) for lp in row]
                        for row in out["logprobs"]
                    ]
                return out

            def _sync(self, trainer: Any) -> None:
                step = trainer.state.global_step
                if kind == "stale-weights" and self.engine is not None and step >= at:
                    return  # the weight update silently fails
                syncs = self.syncs
                super()._sync(trainer)
                if kind == "engine-drift" and step >= at and self.syncs != syncs:
                    generator = torch.Generator().manual_seed(step)
                    scale = DRIFT_PER_STEP * (step - at + 1)
                    with torch.no_grad():
                        for param in self.engine.model.parameters():
                            noise = torch.randn(param.shape, generator=generator)
                            param.mul_(1 + scale * noise.to(param.dtype))

        return _Drill(**kwargs)


#: The fire drills: a silently failed weight sync, engine drift, a growing batch mismatch.
KINDS = ("stale-weights", "engine-drift", "batch-drift")


def parse_drill(text: str) -> tuple[str, int]:
    """``KIND@STEP`` -> (kind, step); kinds: stale-weights, engine-drift, batch-drift."""
    kind, _, step = text.partition("@")
    if kind not in KINDS or not (step.isascii() and step.isdigit()) or int(step) < 1:
        raise argparse.ArgumentTypeError(
            f"--drill {text!r}: expected stale-weights@STEP, engine-drift@STEP or "
            f"batch-drift@STEP with STEP an "
            f"integer >= 1, e.g. stale-weights@20"
        )
    return kind, int(step)


def reward_vowels(completions: list[str], **_: Any) -> list[float]:
    """Toy reward: the share of vowels in the completion."""
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


def load_checkpoint(path: str) -> tuple[Any, Any]:
    """A local causal-LM checkpoint in float32 (master weights) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build_trainer(
    output_dir: str,
    max_steps: int = 3,
    *,
    rollout: str = "hf",
    model_path: str | None = None,
    model: Any = None,
    rollout_func: Any = None,
    peft_config: Any = None,
    seed: int = 0,
    callback: Any = None,
    **config: Any,
) -> Any:
    """A ``GRPOTrainer`` on the toy task with ``callback`` (default ``PrecisionCallback()``,
    whose policy comes from ``enable()``).

    ``rollout`` is ``hf`` (``HFRollout``), ``trl`` (TRL's own generate: no rollout log-probs,
    so no mismatch metrics), ``vllm-colocate`` or ``vllm-server``; ``rollout_func`` replaces
    it. ``model`` (with the recipe's tokenizer) or ``model_path`` replace the built-in model;
    ``config`` goes to ``GRPOConfig``.
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from precision_plugin.trl import HFRollout

    if model_path:
        model, tokenizer = load_checkpoint(model_path)
    else:
        built, tokenizer = build_model_and_tokenizer()
        model = built if model is None else model
    if rollout_func is None and rollout == "hf":
        rollout_func = HFRollout()
    if rollout.startswith("vllm"):
        config.update(use_vllm=True, vllm_mode=rollout.removeprefix("vllm-"))
    prompts = ["say a word", "abc", "hello there", "count to two"] * 4
    settings: dict[str, Any] = {
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": not torch.cuda.is_available(),
        "use_vllm": False,
    }
    args = GRPOConfig(
        output_dir=output_dir, max_steps=max_steps, seed=seed, **{**settings, **config}
    )  # fp16/bf16 left unset: the policy decides (TRL alone would pick bf16)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_vowels,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[callback or PrecisionCallback()],
        rollout_func=rollout_func,
        peft_config=peft_config,
    )


MISMATCH = ("k3_kl", "k1_kl", "prob_diff_mean", "prob_diff_max", "tokens")
CANARY = ("canary_k3", "canary_ratio", "canary_in_band", "canary_verdict",
          "canary_bitwise_equal_frac", "level")  # fmt: skip


def canary_rows(log_history: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    """The canary checks of a run's log history (step, k3, ratio, band, verdict code, level;
    a value that is not finite, e.g. the ratio to a floor of 0, as ``None``)."""
    import math

    return [
        {
            "step": h["step"],
            **{
                k: h[f"precision/{k}"] if math.isfinite(h[f"precision/{k}"]) else None
                for k in CANARY
            },
        }
        for h in log_history
        if "precision/canary_k3" in h
    ]


def mismatch_rows(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The per-step ``precision/*`` mismatch metrics of a run's log history."""
    return [
        {"step": h["step"], **{k: h[f"precision/{k}"] for k in MISMATCH}}
        for h in log_history
        if "precision/k3_kl" in h
    ]


def step_line(row: dict[str, float]) -> str:
    """One printed line of per-step mismatch."""
    return (
        f"step {row['step']:>3}  k3_kl {row['k3_kl']:.3e}  k1_kl {row['k1_kl']:+.3e}  "
        f"prob_diff_mean {row['prob_diff_mean']:.3e}  tokens {row['tokens']:.0f}"
    )


#: Report entries kept out of the printed JSON line (per-step lists; ``--json`` has them).
BULKY = ("canary_checks", "step_times", "canary_seconds")


def canary_line(row: dict[str, float]) -> str:
    """One printed line per canary check."""
    from precision_plugin._core.canary import VERDICT_CODES

    names = {code: name for name, code in VERDICT_CODES.items()}
    ratio = "inf" if row["canary_ratio"] is None else f"{row['canary_ratio']:.3g}"
    return (
        f"canary step {row['step']:>3}  k3 {row['canary_k3']:.3e}  ratio "
        f"{ratio}  in band {bool(row['canary_in_band'])}  verdict "
        f"{names[int(row['canary_verdict'])]}  level {row['level']:.0f}"
    )


def canary_timing(trainer: Any) -> dict[str, Any]:
    """The canary's work per check (s), its one-off level-2 certification (s), and its band's
    upper edge as a ratio to the floor."""
    from precision_plugin.trl.canary import ATTR

    state = getattr(trainer, ATTR, None)
    band = state.monitor.band if state is not None else None
    upper = band.upper / band.floor if band is not None and band.floor > 0 else None
    invariance = getattr(state, "invariance", None)
    return {
        "canary_invariance": invariance.summary() if invariance is not None else None,
        "canary_seconds": list(state.seconds) if state is not None else [],
        "canary_certify_seconds": state.certify_seconds if state is not None else None,
        "canary_band_upper_ratio": upper,
    }


def alarm_of(trainer: Any) -> dict[str, Any] | None:
    """The canary's alarm in this run (step, verdict, stale_since, reason), or ``None``."""
    from precision_plugin.trl.canary import ATTR

    state = getattr(trainer, ATTR, None)
    alarm = state.monitor.alarm if state is not None else None
    if alarm is None:
        return None
    return {"step": alarm.step, "verdict": alarm.verdict, "stale_since": alarm.stale_since,
            "k3": alarm.k3, "reason": alarm.reason}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train a few GRPO steps in the policy dtype and return (and print) what ran."""
    import sys

    from precision_plugin._base.provenance import write_results
    from precision_plugin.audit import render
    from precision_plugin.cli.argtypes import RenamedOption
    from precision_plugin.trl import HFRollout

    # TRL 1.16 on transformers 5.x: their deprecation notices about each other's names, and
    # TRL's note that rollout_func (HFRollout here) is experimental; the recipe's lines follow
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=positive_int, default=3)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--model", default=None, help="a local checkpoint (default: built in code)")
    engines = ["hf", "trl", "vllm-colocate", "vllm-server"]
    parser.add_argument("--engine", choices=engines, default="hf", help="the rollout engine")
    parser.add_argument(
        "--rollout", dest="engine", choices=engines, action=RenamedOption, new="--engine",
        help=argparse.SUPPRESS,  # the old name of --engine (probe's --rollout: its settings)
    )  # fmt: skip
    parser.add_argument(
        "--entry",
        choices=["enable", "callback"],
        default="enable",
        help="enable(): the one line; callback: PrecisionCallback(dtype) alone, flags by hand",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    parser.add_argument("--learning-rate", type=non_negative_float, default=1e-3)
    parser.add_argument(
        "--canary-every",
        type=non_negative_int,
        default=None,
        help="canary check every K steps (policy)",
    )
    parser.add_argument(
        "--drill", type=parse_drill, default=None, metavar="KIND@STEP",
        help="fire drill: stale-weights@STEP, engine-drift@STEP or batch-drift@STEP (HF rollout "
        "only)",
    )  # fmt: skip
    parser.add_argument(
        "--rollout-batch", type=positive_int, default=None, help="HFRollout: sequences per forward"
    )
    parser.add_argument("--strict", action="store_true", help="strictness='error'")
    options = parser.parse_args(argv)
    if options.drill and options.engine != "hf":
        parser.error("--drill needs --engine hf (the drills act on HFRollout's copy)")
    if options.model is not None:  # a local checkpoint folder: the recipe downloads nothing
        try:
            check_model_dir(options.model)
        except pp.PrecisionConfigError as refused:
            parser.error(f"--model: {refused}")
    settings: dict[str, Any] = {"dtype": options.dtype}
    if options.canary_every is not None:
        settings["metrics"] = {"canary_every": options.canary_every}
    if options.strict:
        settings["strictness"] = "error"
    policy = pp.PrecisionPolicy.from_dict(settings)
    entry: dict[str, Any] = {"learning_rate": options.learning_rate}
    if options.entry == "enable":
        pp.enable(policy)  # one dtype on both sides, loss scaler for float16
    else:  # without enable(): the callback and the rollout get the dtype, the flags by hand
        entry.update(
            callback=PrecisionCallback(policy),
            fp16=options.dtype == "float16",
            bf16=options.dtype == "bfloat16",
        )
    if options.engine == "hf":
        rollout_args = {"dtype": options.dtype, "max_batch": options.rollout_batch}
        entry["rollout_func"] = (
            DrillRollout(*options.drill, **rollout_args) if options.drill
            else HFRollout(**rollout_args)
        )  # fmt: skip
    try:
        trainer = build_trainer(
            options.output_dir or tempfile.mkdtemp(),
            options.max_steps,
            rollout=options.engine,
            model_path=options.model,
            seed=options.seed,
            **entry,
        )
        trainer.train()
        history = trainer.state.log_history
        last = next((h for h in reversed(history) if "precision/loss_scale" in h), {})
        callback = next(
            c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback)
        )
        rows = mismatch_rows(history)
        checks = canary_rows(history)
        audit = callback.audit()
        report = {
            "entry": options.entry,
            "dtype": options.dtype,
            "fp16": trainer.args.fp16,
            "bf16": trainer.args.bf16,
            "forward_dtype": str(callback.forward_dtype).removeprefix("torch."),
            "rollout_dtype": audit["rollout"]["dtype"],
            "loss_scale": last.get("precision/loss_scale"),
            "skipped_steps": last.get("precision/skipped_steps"),
            "steps": trainer.state.global_step,
            "mismatch_steps": len(rows),
            "mean_k3_kl": sum(r["k3_kl"] for r in rows) / len(rows) if rows else None,
            "learning_rate": options.learning_rate,
            "drill": "@".join(map(str, options.drill)) if options.drill else None,
            "canary_every": policy.metrics.canary_every,
            "canary_alarm": alarm_of(trainer),
            "level": checks[-1]["level"] if checks else None,
            **canary_timing(trainer),
            "canary_checks": checks,
            "step_times": [h["step_time"] for h in history if "step_time" in h],
        }
    finally:
        pp.disable()
    for row in rows:
        print(step_line(row))
    for check in checks:
        print(canary_line(check))
    print(render(audit, "asked vs ran"), end="")
    print(json.dumps({k: v for k, v in report.items() if k not in BULKY}))
    if options.json:
        words = sys.argv[1:] if argv is None else argv
        command = ["python", "integrations/trl/grpo_fp16.py", *words]
        write_results(
            options.json,
            {"report": report, "steps": rows, "canary": checks, "audit": audit},
            command,
        )
    return report


if __name__ == "__main__":
    try:
        main()
    except pp.PrecisionPluginError as stop:  # a strict stop: its one line, not a traceback
        raise SystemExit(f"{Path(__file__).name}: stopped: {stop}") from None
