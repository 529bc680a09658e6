"""Asked vs ran: what each side of an RL run was configured to do and what actually runs.

[`audit_run`][precision_plugin.audit.audit_run] reads, without changing anything, the learner
(training-args flags, Accelerate's mixed precision, the dtype the training forward produced,
trainable and frozen parameter dtypes, the loss scaler and its settings, the DeepSpeed
precision sections) and the rollout engine as it runs: ``HFRollout``'s copy (its parameters'
and float32 buffers' dtypes, once built; before that, the dtype it was asked for), a colocated
vLLM engine's ``model_config.dtype`` (``LLM.llm_engine.vllm_config.model_config``, vLLM 0.33
``v1/engine/llm_engine.py`` lines 69-70), a vLLM server's via ``/server_info``, and lists every
contradiction with the policy. ``PrecisionCallback`` logs it as a table at train begin and
before the first optimizer step, and raises on a contradiction under ``strictness="error"``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from precision_plugin._base.boundary import checked, dtype_like, torch_module
from precision_plugin._core.master_copy import fp32_master_copy
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")


def _short(dtype: Any) -> str | None:
    if dtype is None:
        return None
    from precision_plugin.policy import normalize_dtype

    text = str(dtype).removeprefix("torch.")
    try:
        return normalize_dtype(text)
    except Exception:
        return text


def _param_dtypes(model: Any, trainable: bool) -> dict[str, int]:
    if model is None:
        return {}
    counts: Counter[str] = Counter()
    for param in model.parameters():
        if param.requires_grad == trainable:
            counts[str(_short(param.dtype))] += param.numel()
    return dict(sorted(counts.items()))


def _scaler(trainer: Any) -> dict[str, Any] | None:
    accelerator = getattr(trainer, "accelerator", None)
    scaler = getattr(accelerator, "scaler", None)
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None
    info: dict[str, Any] = {"class": type(scaler).__name__}
    for key in ("get_scale", "get_growth_interval", "get_growth_factor", "get_backoff_factor"):
        getter = getattr(scaler, key, None)
        if getter is not None:
            try:
                info[key.removeprefix("get_")] = float(getter())
            except Exception:  # a lazily-initialised scale before the first step
                info[key.removeprefix("get_")] = None
    return info


def _deepspeed(trainer: Any) -> dict[str, Any] | None:
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(state, "deepspeed_plugin", None)
    config = getattr(plugin, "deepspeed_config", None) or getattr(plugin, "hf_ds_config", None)
    config = getattr(config, "config", config)
    if not isinstance(config, dict):
        return None
    return {k: config[k] for k in ("fp16", "bf16", "zero_optimization") if k in config}


def learner_side(
    policy: PrecisionPolicy, args: Any, trainer: Any, model: Any, forward_dtype: Any
) -> dict[str, Any]:
    """What the learner was asked to run and what runs."""
    accelerator = getattr(trainer, "accelerator", None)
    model = model if model is not None else getattr(trainer, "model", None)
    ds = _deepspeed(trainer)
    scaler = _scaler(trainer)
    if scaler is None and ds and (ds.get("fp16") or {}).get("enabled") in (True, "auto"):
        scaler = {"class": "DeepSpeed fp16 loss scaler", **(ds.get("fp16") or {})}
    return {
        "policy": policy.dtype,
        "args_fp16": getattr(args, "fp16", None),
        "args_bf16": getattr(args, "bf16", None),
        "accelerate_mixed_precision": getattr(accelerator, "mixed_precision", None),
        "forward_dtype": _short(forward_dtype),
        "trainable_params": _param_dtypes(model, True),
        "frozen_params": _param_dtypes(model, False),
        "loss_scaler": scaler,
        "fp32_master_weights": fp32_master_copy(trainer, model),
        "deepspeed": ds,
    }


def _copy_side(engine_name: str, asked: str, model: Any) -> dict[str, Any]:
    """A rollout copy as it runs: its parameters' dtypes (``dtype``: the dtype most of them
    have) and those of the buffers vLLM keeps in float32; ``None`` before the copy exists."""
    side: dict[str, Any] = {"engine": engine_name, "asked": _short(asked)}
    if model is None:
        return {**side, "dtype": None, "state": "not built yet (built at the first rollout)"}
    from precision_plugin._core.buffers import buffer_dtypes

    params: Counter[str] = Counter()
    for param in model.parameters():
        params[str(_short(param.dtype))] += param.numel()
    return {
        **side,
        "dtype": params.most_common(1)[0][0] if params else None,
        "params": dict(sorted(params.items())),
        "float32_buffers": buffer_dtypes(model),
    }


def colocated_vllm_dtype(llm: Any) -> Any:
    """The dtype a colocated vLLM ``LLM`` runs: ``llm.llm_engine.vllm_config.model_config.dtype``
    (vLLM 0.33 ``entrypoints/llm.py`` line 341, ``v1/engine/llm_engine.py`` lines 69-70), else
    ``llm.llm_engine.model_config`` or ``llm.model_config`` (line 344); ``None`` when absent."""
    engine = getattr(llm, "llm_engine", None)
    config = getattr(engine, "vllm_config", None)
    for model_cfg in (
        getattr(config, "model_config", None),
        getattr(engine, "model_config", None),
        getattr(llm, "model_config", None),
    ):
        if model_cfg is not None:
            return getattr(model_cfg, "dtype", None)
    return None


def rollout_side(trainer: Any) -> dict[str, Any]:
    """Which engine samples the rollouts, and in which dtype it runs (``None`` when unknown)."""
    if trainer is None:
        return {"engine": "unknown (the callback does not know the trainer)", "dtype": None}
    if not hasattr(trainer, "rollout_func") and not hasattr(trainer, "use_vllm"):
        return {"engine": "none (this trainer samples no rollouts)", "dtype": None}
    rollout_func = getattr(trainer, "rollout_func", None)
    dtype = getattr(rollout_func, "dtype", None)
    if rollout_func is not None and isinstance(dtype, str):
        model = getattr(getattr(rollout_func, "engine", None), "model", None)
        return _copy_side(type(rollout_func).__name__, dtype, model)
    if getattr(trainer, "use_vllm", False):
        generation = getattr(trainer, "vllm_generation", None)
        mode = getattr(trainer.args, "vllm_mode", None)
        if mode == "server":
            return _server(getattr(generation, "vllm_client", None))
        llm = getattr(generation, "llm", None)
        return {"engine": "vLLM (colocate)", "dtype": _short(colocated_vllm_dtype(llm))}
    if rollout_func is not None:
        return {"engine": f"rollout_func {getattr(rollout_func, '__name__', rollout_func)!r}",
                "dtype": None}  # fmt: skip
    return {"engine": "transformers generate (the training model)", "dtype": None}


def _server(client: Any) -> dict[str, Any]:
    if client is None:  # the client lives on the main process only
        return {"engine": "vLLM server (asked on the main process)", "dtype": None}
    from precision_plugin.vllm.server import _server_config

    try:
        config, _, where = _server_config(client)
    except Exception as exc:
        return {"engine": "vLLM server", "dtype": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"engine": where, "dtype": _short((config.get("model_config") or {}).get("dtype"))}


#: What to do about each kind of contradiction.
FIXES: dict[str, str] = {
    "forward": "call precision_plugin.enable() before building the trainer",
    "rollout": "run the rollout engine in the learner's dtype: HFRollout(dtype=...) or no dtype "
    "(it follows the policy), enable() before building the trainer for a colocated vLLM, "
    "PRECISION_PLUGIN=<dtype> (or --dtype) for a vLLM server",
    "rollout_buffers": "build the rollout copy with precision_plugin._core.buffers.cast_model "
    "(what "
    "HFRollout does), not a plain .to(dtype)",
    "trainable": "call precision_plugin.enable() before building the trainer, or load the "
    "model in float32 (fp32 master weights, autocast computes in the policy dtype)",
}


def fix_of(kind: str, audit: dict[str, Any], policy: PrecisionPolicy) -> str:
    """What to do about contradiction ``kind`` of ``audit`` (an ``audit_run`` result):
    ``FIXES[kind]``, except for a rollout that runs the policy dtype beside a learner that does
    not (fp16 asked on a CPU without ``enable()``): there the learner is the side to fix, and
    the rollout's own fix ("follow the policy") is what it already does."""
    rollout = audit.get("rollout") or {}
    roll = _short(rollout.get("dtype") or rollout.get("asked"))
    ran = _short((audit.get("learner") or {}).get("forward_dtype"))
    if kind == "rollout" and roll == policy.dtype and ran not in (None, policy.dtype):
        return (
            f"the rollout already runs the policy's {policy.dtype}; the learner does not (its "
            f"forward ran in {ran}): {FIXES['forward']}"
        )
    return FIXES[kind]


@checked
def contradictions(
    policy: PrecisionPolicy, learner: dict[str, Any], rollout: dict[str, Any]
) -> dict[str, str]:
    """Each way what runs contradicts the policy: ``{kind: sentence}`` (empty if consistent).

    Kinds are ``forward`` (the training forward's dtype), ``rollout`` (the dtype the rollout
    engine runs, or before it exists the one it was asked for, against the learner's),
    ``rollout_buffers`` (a rollout copy that rounded the buffers vLLM keeps in float32) and
    ``trainable`` (non-fp32 trainable weights under a scaler, where no engine keeps a float32
    master copy of them: DeepSpeed's fp16/bf16 optimizers and FSDP mixed precision do, see
    [`fp32_master_copy`][precision_plugin._core.master_copy.fp32_master_copy]).
    """
    found: dict[str, str] = {}
    # Every dtype through the one parser: "fp16", "float16" and torch.float16 are one dtype.
    ran = _short(learner.get("forward_dtype"))
    if ran is not None and ran != policy.dtype:
        found["forward"] = (
            f"learner: the training forward ran in {ran}, the policy is {policy.dtype}"
        )
    roll, verb = rollout.get("dtype"), "runs"
    if roll is None and rollout.get("asked") is not None:
        roll, verb = rollout["asked"], "is asked to run"
    roll = _short(roll)
    learner_dtype = ran or policy.dtype
    if roll is not None and (roll != policy.dtype or roll != learner_dtype):
        found["rollout"] = (
            f"rollout: {rollout['engine']} {verb} {roll} while the learner runs {learner_dtype} "
            f"(policy {policy.dtype})"
        )
    rounded = {_short(d) for d in rollout.get("float32_buffers") or {}} - {"float32"}
    if rounded:
        found["rollout_buffers"] = (
            f"rollout: {rollout['engine']}'s copy holds the buffers vLLM keeps in float32 (RoPE "
            f"frequencies) in {sorted(rounded)}: positions are computed unlike vLLM's"
        )
    trainable = learner.get("trainable_params") or {}
    master = learner.get("fp32_master_weights")
    half = {_short(d) for d in trainable} - {"float32"}
    if policy.uses_loss_scaler and learner.get("loss_scaler") and half and not master:
        found["trainable"] = (
            f"learner: trainable parameters in {sorted(trainable)} under a loss scaler, which "
            f"needs float32 master weights ('Attempting to unscale FP16 gradients')"
        )
    return found


@checked(model=torch_module, forward_dtype=dtype_like)
def audit_run(
    policy: PrecisionPolicy,
    args: Any,
    trainer: Any,
    model: Any = None,
    forward_dtype: Any = None,
) -> dict[str, Any]:
    """``{"learner": {...}, "rollout": {...}, "contradictions": {kind: sentence},
    "consistent": bool}``; reads only, changes nothing."""
    learner = learner_side(policy, args, trainer, model, forward_dtype)
    rollout = rollout_side(trainer)
    found = contradictions(policy, learner, rollout)
    return {"learner": learner, "rollout": rollout, "contradictions": found,
            "consistent": not found}  # fmt: skip


@checked
def render(audit: dict[str, Any], title: str) -> str:
    """The audit as a rich table (plain text)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    table.add_column("side")
    table.add_column("item")
    table.add_column("value", overflow="fold")
    for side in ("learner", "rollout"):
        for key, value in audit[side].items():
            table.add_row(side, key, "-" if value is None else str(value))
    verdict = "consistent" if audit["consistent"] else "; ".join(audit["contradictions"].values())
    table.add_row("verdict", "", verdict)
    console = Console(width=120, record=True, file=_Null())
    console.print(table)
    return console.export_text()


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass
