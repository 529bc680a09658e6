"""Run the sanity benchmark: pretrain once, then GRPO in each dtype from the same weights.

Each dtype gets ``precision_plugin.enable(dtype=...)``, TRL's ``GRPOTrainer`` with
``PrecisionCallback`` and, with the ``hf`` engine, ``HFRollout`` (an inference copy of the
policy in the policy dtype, synced after every optimizer step, like vLLM). Everything per step
is read from the trainer's own log history: TRL's reward and the plugin's ``precision/*``
metrics; nothing is measured twice.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sanity.model import build_model, parameter_count
from precision_plugin.sanity.pretrain import PretrainSettings, pretrain
from precision_plugin.sanity.schema import DtypeRun, SanityConfig, SanityResult, StepRecord
from precision_plugin.sanity.task import make_problems, reward_exact

log = logging.getLogger("precision_plugin")

ProgressFn = Callable[[str, int, int], None]
#: TRL's log key for the mean of our reward function (binary, so it is the accuracy).
ACCURACY_KEY = f"rewards/{reward_exact.__name__}/mean"
#: Lengths of the task strings (the completion is the string reversed plus EOS).
MIN_LEN, MAX_LEN = 3, 6


def smoke_config(**overrides: Any) -> SanityConfig:
    """The CI-sized run: tiny model, 6 steps per dtype, all three dtypes."""
    settings: dict[str, Any] = {"steps": 6, "model_size": "tiny", "smoke": True}
    return SanityConfig(**{**settings, **overrides})


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


def run_sanity(config: SanityConfig, progress: ProgressFn | None = None) -> SanityResult:
    """Pretrain, then run GRPO once per dtype from identical weights and seeds."""
    import torch

    check_engine(config.engine)
    report = progress or (lambda *_: None)
    problems = make_problems(config.num_problems, config.seed, MIN_LEN, MAX_LEN)
    with _one_thread():
        model, tokenizer = build_model(config.model_size, config.seed)
        settings = PretrainSettings(min_len=MIN_LEN, max_len=MAX_LEN)
        if config.smoke:
            settings = PretrainSettings(min_len=MIN_LEN, max_len=MAX_LEN, target=0.2, max_steps=400)
        started = time.perf_counter()
        pre = pretrain(model, tokenizer, problems, config.seed, settings, progress=report)
        pretrain_info = {
            "steps": pre.steps,
            "loss": pre.loss,
            "sampled_accuracy": pre.accuracy,
            "target": settings.target,
            "reached_target": pre.reached_target,
            "seconds": time.perf_counter() - started,
        }
        if not pre.reached_target:
            log.warning(
                "precision_plugin: sanity pretraining stopped at %.2f sampled accuracy, below "
                "its %.2f target, after %d steps",
                pre.accuracy,
                settings.target,
                pre.steps,
            )
        runs = {}
        for dtype in config.dtypes:
            runs[dtype] = _run_dtype(config, dtype, model, tokenizer, problems, report)
    result = SanityResult(
        config=config,
        pretrain=pretrain_info,
        model={
            "architecture": "LlamaForCausalLM",
            "size": config.model_size,
            "parameters": parameter_count(model),
            "vocab": len(tokenizer),
        },
        runs=runs,
        environment={
            "torch": torch.__version__,
            "trl": _version("trl"),
            "transformers": _version("transformers"),
            "device": "cuda" if config.engine == "vllm" else "cpu",
            "python": platform.python_version(),
        },
    )
    for run in runs.values():
        run.summarize()
    return result


def _version(name: str) -> str | None:
    from precision_plugin.versions import installed_version

    found = installed_version(name)
    return str(found) if found is not None else None


def _run_dtype(
    config: SanityConfig,
    dtype: str,
    pretrained: Any,
    tokenizer: Any,
    problems: list[Any],
    progress: ProgressFn,
) -> DtypeRun:
    """GRPO for ``config.steps`` steps in ``dtype`` from a copy of ``pretrained``."""
    import precision_plugin as pp

    started = time.perf_counter()
    pp.enable(dtype=dtype)
    try:
        with tempfile.TemporaryDirectory(prefix="precision-sanity-") as out:
            trainer = _build_trainer(config, dtype, pretrained, tokenizer, problems, out, progress)
            trainer.train()
            history = list(trainer.state.log_history)
            audit = _audit(trainer)
    finally:
        pp.disable()
    steps = [_record(h) for h in history if "loss" in h and "step" in h]
    return DtypeRun(dtype=dtype, steps=steps, seconds=time.perf_counter() - started, ran=audit)


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

    return StepRecord(
        step=int(entry["step"]),
        reward=get("reward"),
        accuracy=get(ACCURACY_KEY),
        k3_kl=get("precision/k3_kl"),
        prob_diff_max=get("precision/prob_diff_max"),
        loss_scale=get("precision/loss_scale"),
        skipped_steps=get("precision/skipped_steps"),
    )


def _build_trainer(
    config: SanityConfig,
    dtype: str,
    pretrained: Any,
    tokenizer: Any,
    problems: list[Any],
    output_dir: str,
    progress: ProgressFn,
) -> Any:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from precision_plugin import PrecisionCallback
    from precision_plugin.trl import HFRollout

    class _Progress(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            progress(f"GRPO {dtype}", state.global_step, config.steps)

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
            # plain GRPO, as with HFRollout (TRL corrects only vLLM rollouts) and the paper
            "vllm_importance_sampling_correction": False,
        }
        rollout_func = None
    progress(f"GRPO {dtype}", 0, config.steps)
    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=config.steps,
        seed=config.seed,
        per_device_train_batch_size=config.prompts_per_step * config.num_generations,
        num_generations=config.num_generations,
        max_completion_length=MAX_LEN + 2,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        temperature=config.temperature,
        beta=0.0,  # no reference model, as in the paper's sanity runs
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=config.engine != "vllm" and not torch.cuda.is_available(),
        **({"use_vllm": False} | extra),
    )  # fp16/bf16 unset: the policy decides
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_exact,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [p.prompt for p in problems]}),
        processing_class=tokenizer,
        callbacks=[PrecisionCallback(), _Progress()],
        rollout_func=rollout_func,
    )
    # The CLI shows its own progress bar; the trainer's printed logs would bury it.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer
