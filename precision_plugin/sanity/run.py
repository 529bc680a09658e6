"""Run the sanity benchmark: per seed, pretrain once, then GRPO in each dtype from those weights.

Each dtype gets ``precision_plugin.enable(dtype=...)``, TRL's ``GRPOTrainer`` with
``PrecisionCallback`` and, with the ``hf`` engine, ``HFRollout`` (an inference copy of the
policy in the policy dtype, synced after every optimizer step, like vLLM). Everything per step
is read from the trainer's own log history: TRL's reward, the plugin's ``precision/*`` metrics
and, when on, the gradient-cosine readout (``precision_plugin.sanity.mechanism``); nothing is
measured twice. Within a seed the dtypes are paired: same pretrained weights, same problems,
same trainer seed (so the same prompt order and the same rollout sampling seeds).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import platform
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.progress import ProgressFn
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sanity.model import build_model, parameter_count
from precision_plugin.sanity.pretrain import PretrainSettings, pretrain
from precision_plugin.sanity.schema import (
    DtypeRun,
    SanityConfig,
    SanityResult,
    SeedRun,
    StepRecord,
)
from precision_plugin.sanity.task import ACCURACY_KEY, Problem

log = logging.getLogger("precision_plugin")

#: Log keys read into a [`StepRecord`][precision_plugin.sanity.StepRecord]; every other
#: ``precision/*`` key lands in its ``telemetry`` dict.
STEP_KEYS: dict[str, str] = {
    "reward": "reward",
    "accuracy": ACCURACY_KEY,
    "k3_kl": "precision/k3_kl",
    "prob_diff_max": "precision/prob_diff_max",
    "loss_scale": "precision/loss_scale",
    "skipped_steps": "precision/skipped_steps",
    "grad_cosine": "sanity/grad_cosine",
    "seq_log_ratio_abs": "sanity/seq_log_ratio_abs",
}


@checked
def check_engine(engine: str) -> None:
    """Refuse ``vllm`` where it cannot run (not installed, or no CUDA), in one line."""
    if engine != "vllm":
        return
    import torch

    if importlib.util.find_spec("vllm") is None:
        raise PrecisionConfigError(
            "--engine vllm: vLLM is not installed; install it on a CUDA machine "
            "(pip install vllm) or use --engine hf."
        )
    if not torch.cuda.is_available():
        raise PrecisionConfigError(
            "--engine vllm: vLLM needs a CUDA GPU and none is visible; run on a GPU machine "
            "or use --engine hf."
        )


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    # Matmuls this small do not gain from threads, and on a shared CPU two threads per process
    # ran ~10x slower than one (measured): pin one, restore after.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@checked
def run_sanity(config: SanityConfig, progress: ProgressFn | None = None) -> SanityResult:
    """For each seed: pretrain, then run GRPO once per dtype from those weights (paired)."""
    import torch

    check_engine(config.engine)
    report = progress or (lambda *_: None)
    seeds, model_info = [], {}
    with _one_thread():
        for seed in config.seeds:
            model, tokenizer, problems, pretrain_info = _pretrained(config, seed, report)
            model_info = {
                "architecture": "LlamaForCausalLM",
                "size": config.model_size,
                "parameters": parameter_count(model),
                "vocab": len(tokenizer),
                "max_position_embeddings": model.config.max_position_embeddings,
            }
            runs = {
                dtype: _run_dtype(config, seed, dtype, model, tokenizer, problems, report)
                for dtype in config.dtypes
            }
            for run in runs.values():
                run.summarize(config.window)
            seeds.append(SeedRun(seed=seed, pretrain=pretrain_info, runs=runs))
    return SanityResult(
        config=config,
        model=model_info,
        seeds=seeds,
        environment={
            "torch": torch.__version__,
            "trl": _version("trl"),
            "transformers": _version("transformers"),
            "device": "cuda" if config.engine == "vllm" else "cpu",
            "python": platform.python_version(),
        },
    )


def _pretrained(
    config: SanityConfig, seed: int, progress: ProgressFn
) -> tuple[Any, Any, list[Problem], dict[str, Any]]:
    """The seed's problems and model, pretrained (float32) into the partly-solved band."""
    task = config.task
    problems = task.make_problems(config.num_problems, seed)
    model, tokenizer = build_model(config.model_size, seed, task)
    settings = PretrainSettings(
        target=config.pretrain_target,
        max_steps=config.pretrain_max_steps,
        batch_size=config.pretrain_batch_size,
        learning_rate=config.pretrain_learning_rate,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    label = f"pretraining seed {seed} (float32)"
    pre = pretrain(
        model, task, tokenizer, problems, seed, settings,
        progress=lambda _, done, total: progress(label, done, total),
    )  # fmt: skip
    info = {
        "steps": pre.steps,
        "loss": pre.loss,
        "sampled_accuracy": pre.accuracy,
        "target": settings.target,
        "reached_target": pre.reached_target,
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
    }
    if not pre.reached_target:
        log.warning(
            "precision_plugin: sanity pretraining (seed %d) stopped at %.2f sampled accuracy, "
            "below its %.2f target, after %d steps",
            seed,
            pre.accuracy,
            settings.target,
            pre.steps,
        )
    return model, tokenizer, problems, info


def _version(name: str) -> str | None:
    from precision_plugin._base.versions import installed_version

    found = installed_version(name)
    return str(found) if found is not None else None


def _run_dtype(
    config: SanityConfig,
    seed: int,
    dtype: str,
    pretrained: Any,
    tokenizer: Any,
    problems: list[Problem],
    progress: ProgressFn,
) -> DtypeRun:
    """GRPO for ``config.steps`` steps in ``dtype`` from a copy of ``pretrained``."""
    import precision_plugin as pp

    wall, cpu = time.perf_counter(), time.process_time()
    pp.enable(dtype=dtype)
    try:
        with tempfile.TemporaryDirectory(prefix="precision-sanity-") as out:
            trainer = _build_trainer(
                config, seed, dtype, pretrained, tokenizer, problems, out, progress
            )
            try:
                trainer.train()
            except RuntimeError as exc:
                _refuse_divergence(exc, trainer, config, seed, dtype)
                raise
            history = list(trainer.state.log_history)
            audit = _audit(trainer)
    finally:
        pp.disable()
    steps = [_record(h) for h in history if "loss" in h and "step" in h]
    return DtypeRun(
        dtype=dtype,
        steps=steps,
        seconds=time.perf_counter() - wall,
        cpu_seconds=time.process_time() - cpu,
        ran=audit,
    )


def _refuse_divergence(
    exc: RuntimeError, trainer: Any, config: SanityConfig, seed: int, dtype: str
) -> None:
    """Turn a run whose weights or sampling probabilities went NaN or inf (a learning rate far
    too large) into one message, instead of torch's ``probability tensor contains either inf,
    nan or element < 0`` from deep inside generation; any other error is left as it is."""
    import torch

    weights_broken = any(not torch.isfinite(p).all() for p in trainer.model.parameters())
    if not weights_broken and "nan" not in str(exc).lower():
        return
    raise PrecisionConfigError(
        f"learning-rate: GRPO in {dtype} (seed {seed}) diverged at step "
        f"{trainer.state.global_step + 1} of {config.steps}: the policy's "
        f"{'weights' if weights_broken else 'sampling probabilities'} became NaN or inf at "
        f"--learning-rate {config.learning_rate:g}; pass a smaller one (default "
        f"{SanityConfig.learning_rate:g})."
    ) from None


def _audit(trainer: Any) -> dict[str, Any]:
    """What ran on each side, from ``PrecisionCallback``'s asked-vs-ran audit."""
    from precision_plugin import PrecisionCallback

    callback = next(
        c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback)
    )
    audit = callback.audit()
    return {
        "consistent": bool(audit.get("consistent")),
        "learner_forward_dtype": (audit.get("learner") or {}).get("forward_dtype"),
        "rollout_dtype": (audit.get("rollout") or {}).get("dtype"),
        "rollout_engine": (audit.get("rollout") or {}).get("engine"),
    }


def _record(entry: dict[str, Any]) -> StepRecord:
    def get(key: str) -> float | None:
        value = entry.get(key)
        return float(value) if value is not None else None

    known = set(STEP_KEYS.values())
    telemetry = {
        k.removeprefix("precision/"): get(k)
        for k in entry
        if k.startswith("precision/") and k not in known
    }
    return StepRecord(
        step=int(entry["step"]),
        **{name: get(key) for name, key in STEP_KEYS.items()},
        telemetry=telemetry,
    )


def _build_trainer(
    config: SanityConfig,
    seed: int,
    dtype: str,
    pretrained: Any,
    tokenizer: Any,
    problems: list[Problem],
    output_dir: str,
    progress: ProgressFn,
) -> Any:
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from precision_plugin.sanity.mechanism import GradCosineReadout
    from precision_plugin.trl import HFRollout

    label = f"GRPO {dtype} seed {seed}"

    class _Progress(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            progress(label, state.global_step, config.steps)

    model = copy.deepcopy(pretrained)
    extra: dict[str, Any] = {}
    rollout_func: Any = HFRollout()
    if config.engine == "vllm":
        # vLLM loads weights from a folder: save the pretrained model where it can read them.
        model.save_pretrained(output_dir + "/model")
        tokenizer.save_pretrained(output_dir + "/model")
        model.name_or_path = model.config._name_or_path = output_dir + "/model"
        extra = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.3,
            # plain policy gradient, as with HFRollout (TRL corrects only vLLM rollouts) and
            # the paper's sanity runs
            "vllm_importance_sampling_correction": False,
        }
        rollout_func = None
    progress(label, 0, config.steps)
    with warnings.catch_warnings():
        # TRL flags rollout_func as experimental, transformers a renamed argument it sets
        # itself: neither is the user's to act on, and they would interleave the progress.
        warnings.filterwarnings("ignore", message=".*rollout_func.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=FutureWarning)
        trainer = _trainer(config, seed, model, tokenizer, problems, output_dir, extra,
                           rollout_func, [_Progress()])  # fmt: skip
    if config.grad_cosine:
        GradCosineReadout().attach(trainer)
    # The CLI shows its own progress; the trainer's printed logs would bury it.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def _trainer(
    config: SanityConfig,
    seed: int,
    model: Any,
    tokenizer: Any,
    problems: list[Problem],
    output_dir: str,
    extra: dict[str, Any],
    rollout_func: Any,
    callbacks: list[Any],
) -> Any:
    """TRL's ``GRPOTrainer`` for one dtype (the active policy sets fp16/bf16)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from precision_plugin import PrecisionCallback

    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=config.steps,
        seed=seed,
        per_device_train_batch_size=config.prompts_per_step * config.num_generations,
        num_generations=config.num_generations,
        max_completion_length=config.task.max_completion_tokens,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        temperature=config.temperature,
        loss_type=config.loss_type,
        beta=0.0,  # no reference model, as in the paper's sanity runs
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=config.engine != "vllm" and not torch.cuda.is_available(),
        **({"use_vllm": False} | extra),
    )  # fp16/bf16 unset: the policy decides
    return GRPOTrainer(
        model=model,
        reward_funcs=config.task.reward_function(),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [p.prompt for p in problems]}),
        processing_class=tokenizer,
        callbacks=[PrecisionCallback(), *callbacks],
        rollout_func=rollout_func,
    )
