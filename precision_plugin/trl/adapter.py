"""TRL adapter hooks: TRL configs follow the policy's precision, and TRL's metric names get aliases.

With ``enable()``, a TRL config (``GRPOConfig``, ``RLOOConfig``, ``SFTConfig``, ...) built without
``fp16``/``bf16`` takes the policy's flags instead of TRL's default ``bf16=True``; an explicit
contradiction is coerced or refused by the HF-Trainer adapter (TRL configs are
``TrainingArguments``). TRL's cast of QLoRA adapters to bf16 happens before ``Trainer.__init__``,
where the HF-Trainer adapter casts them back to fp32 master weights.

GRPO runs also get the train/rollout mismatch as ``precision/*`` metrics
(``precision_plugin.trl.telemetry``), and ``HFRollout`` (``precision_plugin.trl.rollout``)
is a ``rollout_func`` that samples in the policy dtype without vLLM.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.report import Finding
from precision_plugin._base.versions import installed_version
from precision_plugin._core.metrics.mismatch import aliases_for
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.trl import canary as trl_canary
from precision_plugin.trl import sync_check as trl_sync_check
from precision_plugin.trl import telemetry as trl_telemetry

log = logging.getLogger("precision_plugin")

#: TRL's train/rollout mismatch metrics (logged when ``vllm_importance_sampling_correction`` is
#: on) -> our names, read from the one alias table,
# ``precision_plugin._core.metrics.mismatch.ALIASES``.
TRL_METRIC_ALIASES: dict[str, str] = aliases_for("TRL")


@hookimpl
def precision_collect_metrics(
    policy: PrecisionPolicy, trainer: Any, logs: Any, mismatch_due: bool
) -> dict[str, float]:
    """With ``mismatch_due``: TRL's own mismatch metrics under our names, then the plugin's
    token-weighted ones measured over every process (which replace TRL's where both exist),
    then the drift canary's when a check is due (``precision_plugin.trl.canary``)."""
    if not mismatch_due:
        return {}
    batch = {**alias_metrics(logs or {}), **trl_telemetry.flush(trainer)}
    return {
        **batch,
        **trl_canary.collect(trainer, policy, batch),
        **trl_sync_check.metrics(trainer),  # a faulty sync's verdict wins over the canary's
    }


@checked
def alias_metrics(logs: Mapping[str, Any]) -> dict[str, float]:
    """TRL's mismatch metrics found in ``logs``, under our names (without the prefix).

    TRL's figures equal ours only under the conditions ``ALIASES`` records (one process, one
    generation batch per logged step); with more, they are TRL's unweighted averages.
    """
    return {
        ours: float(logs[theirs]) for theirs, ours in TRL_METRIC_ALIASES.items() if theirs in logs
    }


def _post_init(policy: PrecisionPolicy, original: Callable[..., Any], self: Any) -> None:
    # TRL turns an unset bf16 into True before TrainingArguments.__post_init__ runs: settle the
    # flags first (the HF-Trainer adapter's one decision; that level then finds them settled).
    from precision_plugin.transformers import settle_training_flags

    settle_training_flags(self, policy)
    original(self)


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Any) -> None:
    """Wrap TRL's base config ``__post_init__`` so unset flags follow the policy."""
    if installed_version("trl") is None:
        return
    patcher.wrap_on_import(
        "trl.trainer.base_config",
        "_BaseConfig.__post_init__",
        functools.partial(_post_init, policy),
        reason="TRL turns an unset bf16 into bf16=True inside __post_init__; no hook runs first",
        missing="flags left to TRL",
    )
    # The mismatch telemetry reads the per-token log-probs where GRPO computes its loss.
    reason = (
        "TRL has no hook that sees the loss's per-token log-probs next to the rollout's (an "
        "extra forward would change what is measured)"
    )
    # The colocated vLLM engine: weights kept syncable on vLLM's CPU build, each sync checked.
    trl_sync_check.install(policy, patcher)
    for path, advice in (
        ("GRPOTrainer._compute_loss", functools.partial(trl_telemetry.compute_loss, policy)),
        ("GRPOTrainer._get_per_token_logps_and_entropies", trl_telemetry.per_token_logps),
    ):
        patcher.wrap_on_import(
            "trl.trainer.grpo_trainer", path, advice, reason=reason, missing="no mismatch metrics"
        )


@hookimpl
def precision_train_begin(
    policy: PrecisionPolicy, args: Any, state: Any, model: Any, trainer: Any
) -> None:
    """Warn about TRL options that change parameter dtypes after the first step; without
    ``enable()``, measure this GRPO trainer's mismatch (the callback's own trainer)."""
    if trainer is not None and policy.metrics.enabled:
        trl_telemetry.attach(trainer, policy)
    if policy.uses_loss_scaler and getattr(args, "use_transformers_continuous_batching", False):
        log.warning(
            "precision_plugin: use_transformers_continuous_batching=True makes TRL cast the "
            "training model to fp16 in place during generation, which leaves fp16 trainable "
            "parameters ('Attempting to unscale FP16 gradients'). Fix: turn it off, or use vLLM "
            "for generation (use_vllm=True)."
        )


@hookimpl
def precision_train_end(trainer: Any) -> None:
    """Remove the per-trainer telemetry ``precision_train_begin`` attached."""
    trl_telemetry.detach(trainer)


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding] | None:
    """What TRL would run, and what ``enable()`` changes."""
    version = installed_version("trl")
    if version is None:
        return None
    findings = [
        Finding("trl", "info", f"trl {version} installed"),
        Finding(
            "trl",
            "change" if policy.dtype != "bfloat16" else "ok",
            f"TRL configs default to bf16=True; with enable() unset flags follow the "
            f"{policy.dtype} policy",
        ),
    ]
    if installed_version("peft") is not None:  # QLoRA adapters need PEFT
        findings.append(
            Finding(
                "trl",
                "warning" if policy.uses_loss_scaler else "info",
                "GRPOTrainer casts QLoRA adapter weights to bf16, which breaks the fp16 loss "
                "scaler; enable() (or PrecisionCallback) casts them back to fp32 master weights",
            )
        )
    return findings
