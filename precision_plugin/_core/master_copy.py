"""Where a run keeps its float32 master weights, when its module parameters are half precision.

A loss scaler needs float32 master weights: an optimizer stepping float16 parameters directly
loses small updates (and torch's ``GradScaler`` refuses: "Attempting to unscale FP16
gradients"). Some engines keep that float32 copy themselves, inside their optimizer, and hold the
module's parameters in half precision on purpose; their half-precision parameters are right:

- DeepSpeed fp16 and bf16 engines, ZeRO stage 0 to 3 (DeepSpeed 0.19
  ``runtime/fp16/fused_optimizer.py`` ``fp32_groups_flat``, ``unfused_optimizer.py``
  ``fp32_groups``, ``runtime/bf16_optimizer.py`` ``fp32_groups_flat_partition``,
  ``runtime/zero/stage_1_and_2.py`` ``single_partition_of_fp32_groups``,
  ``runtime/zero/stage3.py`` ``fp32_partitioned_groups_flat``);
- FSDP with ``MixedPrecision(param_dtype=...)`` (FSDP1) or ``MixedPrecisionPolicy`` (FSDP2),
  whose sharded parameters, which the optimizer steps, stay in their own dtype.

[`fp32_master_copy`][precision_plugin._core.master_copy.fp32_master_copy] reads the trainer's engine
and optimizer and names the float32 copy it finds (checked by the tensors' dtype, so DeepSpeed's
``fp16_master_weights_and_gradients``, a half-precision "master" copy, is not one). Reads only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Optimizer attributes that hold a float32 master copy, with the optimizer they belong to.
MASTER_ATTRIBUTES: dict[str, str] = {
    "single_partition_of_fp32_groups": "DeepSpeed ZeRO-1/2 optimizer",
    "fp32_partitioned_groups_flat": "DeepSpeed ZeRO-3 optimizer",
    "fp32_groups_flat_partition": "DeepSpeed BF16_Optimizer",
    "fp32_groups_flat": "DeepSpeed FP16_Optimizer",
    "fp32_groups": "DeepSpeed FP16_UnfusedOptimizer",
}


def _tensors(value: Any) -> Iterator[Any]:
    """The tensors in ``value`` (a tensor, or lists/tuples of them, nested)."""
    if hasattr(value, "dtype") and hasattr(value, "numel"):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _optimizers(trainer: Any, model: Any) -> Iterator[Any]:
    """Every optimizer object reachable from the trainer or model, outermost first (Accelerate's
    and the HF Trainer's wrappers keep the real one under ``.optimizer``)."""
    engines = (
        getattr(trainer, "model_wrapped", None),
        getattr(trainer, "deepspeed", None),
        model,
    )
    roots = [getattr(trainer, "optimizer", None)]
    roots += [getattr(e, "optimizer", None) for e in engines if e is not None]
    seen: set[int] = set()
    for root in roots:
        current, depth = root, 0
        while current is not None and id(current) not in seen and depth < 4:
            seen.add(id(current))
            yield current
            current, depth = getattr(current, "optimizer", None), depth + 1


def _deepspeed_master(trainer: Any, model: Any) -> str | None:
    for optimizer in _optimizers(trainer, model):
        for attribute, owner in MASTER_ATTRIBUTES.items():
            tensors = list(_tensors(getattr(optimizer, attribute, None)))
            if tensors and all(str(t.dtype) == "torch.float32" for t in tensors):
                name = type(optimizer).__name__
                return f"{owner} ({name}.{attribute}, float32)"
    return None


def _fsdp_master(trainer: Any, model: Any) -> str | None:
    import torch

    for wrapped in (getattr(trainer, "model_wrapped", None), model):
        if wrapped is None or not isinstance(wrapped, torch.nn.Module):
            continue
        mixed = getattr(wrapped, "mixed_precision", None)  # FSDP1's MixedPrecision
        state = getattr(wrapped, "_get_fsdp_state", None)  # FSDP2 (fully_shard)
        if mixed is None and state is not None:
            mixed = getattr(state(), "_mp_policy", None)
        param_dtype = getattr(mixed, "param_dtype", None)
        if param_dtype is None:
            continue
        dtypes = {str(p.dtype) for p in wrapped.parameters() if p.requires_grad}
        if dtypes == {"torch.float32"}:
            kind = "FSDP2 MixedPrecisionPolicy" if state is not None else "FSDP MixedPrecision"
            short = str(param_dtype).removeprefix("torch.")
            return f"{kind}(param_dtype={short}): sharded float32 parameters"
    return None


def fp32_master_copy(trainer: Any, model: Any = None) -> str | None:
    """Where the run's engine keeps float32 master weights of the parameters it trains in half
    precision (a short description), or ``None`` when it keeps none (the module's own
    parameters are then what the optimizer steps)."""
    if trainer is None and model is None:
        return None
    return _deepspeed_master(trainer, model) or _fsdp_master(trainer, model)
