"""TRL's colocated vLLM engine: weights kept syncable on vLLM's CPU build, and every weight sync
checked (``precision_plugin._core.canary.sync_check``).

Two wrappers on ``trl.generation.vllm_generation.VLLMGeneration`` (installed by ``enable()``):

- ``__init__``: in colocate mode, before TRL builds its ``LLM(...)``, vLLM's CPU build is made to
  keep its Linear weights when ``vllm.cpu_keep_weights`` says so
  ([`keep_cpu_weights`][precision_plugin.vllm.cpu_weights.keep_cpu_weights]);
- ``sync_weights``: after TRL pushes the learner's weights (``model.load_weights``), the engine
  and the learner score ``SEQUENCES`` fixed token sequences; a gap far beyond the dtype's
  rounding is a ``weight_sync_fault``: raised as
  [`CanaryAlarmError`][precision_plugin.errors.CanaryAlarmError] under ``strictness="error"``,
  warned otherwise, and logged as ``precision/sync_check_ratio``, ``precision/sync_check_faulty``
  and ``precision/canary_verdict`` = 4.
"""

from __future__ import annotations

import logging
from typing import Any

from precision_plugin._base.patching import Patcher
from precision_plugin._base.shield import shielded
from precision_plugin._core.canary.sync_check import SyncCheck, check_sync, sync_sequences
from precision_plugin.errors import CanaryAlarmError
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: Attribute of a ``VLLMGeneration`` holding its sync-check state.
ATTR = "_precision_plugin_sync_check"
#: ``precision/canary_verdict`` of a faulty weight sync (the canary's codes are 1-3).
SYNC_FAULT_CODE = 4

_FIX = (
    "on vLLM's CPU build keep the engine's weights syncable: precision_plugin.enable() (policy "
    "vllm.cpu_keep_weights 'auto' or 'on') before the trainer is built; elsewhere check the "
    "weight sync's parameter-name mapping and which layers it reaches"
)


class _State:
    """A generation object's syncs, its fixed sequences and its checks."""

    def __init__(self) -> None:
        self.syncs = 0
        self.sequences: Any = None
        self.checks: list[SyncCheck] = []
        self.warned = False
        self.off_reason: str | None = None


def _init(policy: PrecisionPolicy, patcher: Patcher, original: Any, self: Any, *a: Any, **kw: Any):
    from precision_plugin.vllm.cpu_weights import keep_cpu_weights, wants_kept_weights

    mode = kw.get("mode", a[3] if len(a) > 3 else "colocate")
    if mode == "colocate" and wants_kept_weights(policy, weight_sync=True):
        keep_cpu_weights(patcher)
    return original(self, *a, **kw)


def _forward_dtype(generation: Any, model: Any) -> str | None:
    """The dtype the learner's training forward computes in, or ``None`` when its weights are
    not float32 masters (then there is no float32 reference to compare with)."""
    import torch

    if next(model.parameters()).dtype != torch.float32:
        return None
    precision = str(getattr(generation.accelerator, "mixed_precision", "no"))
    return {"fp16": "float16", "bf16": "bfloat16"}.get(precision, "float32")


def _vocab(generation: Any, model: Any) -> int:
    size = int(model.get_input_embeddings().num_embeddings)
    tokenizer = getattr(generation, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    if tokenizer is not None and hasattr(tokenizer, "__len__"):
        size = min(size, len(tokenizer))
    return size


def run_check(generation: Any, policy: PrecisionPolicy) -> SyncCheck | None:
    """Score the fixed sequences on both sides after a sync and judge it (``None`` when this
    learner cannot be checked: no float32 master weights, or a PEFT adapter)."""
    from precision_plugin._core.scoring import HFScorer
    from precision_plugin._core.scoring.vllm import VLLMScorer
    from precision_plugin.trl.canary import _class_forward, _scored_in_eval

    state = getattr(generation, ATTR)
    model = generation.accelerator.unwrap_model(generation.model)
    dtype = _forward_dtype(generation, model)
    if dtype is None or hasattr(model, "peft_config"):
        if state.off_reason is None:
            state.off_reason = "the learner has no float32 master weights to compare with"
            if hasattr(model, "peft_config"):
                state.off_reason = "a PEFT learner's synced weights are merged ones"
            log.info("precision_plugin: weight-sync check off: %s.", state.off_reason)
        return None
    if state.sequences is None:
        state.sequences = sync_sequences(_vocab(generation, model))
    engine = VLLMScorer(generation.llm).score(state.sequences)
    learner = _scored_in_eval(HFScorer(model, autocast=dtype, batch_size=4), state.sequences)
    reference = learner
    if dtype != "float32":
        reference = _scored_in_eval(HFScorer(_class_forward(model), batch_size=4), state.sequences)
    return check_sync(state.syncs, engine, learner, reference)


def _judge(check: SyncCheck, policy: PrecisionPolicy, state: _State) -> None:
    line = check.message(policy.dtype)
    if not check.faulty:
        log.info("precision_plugin: %s.", line)
        return
    if policy.strictness == "error":
        raise CanaryAlarmError(
            f"precision_plugin: weight_sync_fault: {line} (strictness='error'). Fix: {_FIX}.",
            verdict="weight_sync_fault",
            step=check.sync,
            stale_since=None,
        )
    if not state.warned:
        state.warned = True
        log.warning("precision_plugin: weight_sync_fault: %s. Fix: %s.", line, _FIX)


def _sync_weights(policy: PrecisionPolicy, original: Any, self: Any, *a: Any, **kw: Any) -> Any:
    result = original(self, *a, **kw)
    if not policy.vllm.sync_check or getattr(self, "mode", None) != "colocate":
        return result
    if getattr(self, "llm", None) is None:
        return result
    state = getattr(self, ATTR, None)
    if state is None:
        state = _State()
        setattr(self, ATTR, state)
    state.syncs += 1
    with shielded("the weight-sync check", policy.strictness):
        check = run_check(self, policy)
        if check is not None:
            state.checks.append(check)
            _judge(check, policy, state)
    return result


def install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Wrap ``VLLMGeneration.__init__`` and ``sync_weights`` (on import of TRL's module)."""
    import functools

    module = "trl.generation.vllm_generation"
    patcher.wrap_on_import(
        module,
        "VLLMGeneration.__init__",
        functools.partial(_init, policy, patcher),
        reason="TRL builds its colocated LLM(...) inside __init__; vLLM's CPU weight prepacking "
        "must be settled before it",
        missing="no colocate engine set-up to adjust",
    )
    patcher.wrap_on_import(
        module,
        "VLLMGeneration.sync_weights",
        functools.partial(_sync_weights, policy),
        reason="TRL reports nothing after load_weights; the engine is checked right after it",
        missing="no weight-sync check",
    )


def metrics(trainer: Any) -> dict[str, float]:
    """The last sync check of ``trainer``'s colocated engine (names without the prefix)."""
    generation = getattr(trainer, "vllm_generation", None)
    state = getattr(generation, ATTR, None) if generation is not None else None
    checks = getattr(state, "checks", None)
    if not checks:
        return {}
    check = checks[-1]
    out = {"sync_check_ratio": check.ratio, "sync_check_faulty": float(check.faulty)}
    if check.faulty:
        out["canary_verdict"] = float(SYNC_FAULT_CODE)
    return out


__all__ = ["install", "metrics", "run_check"]
