"""The device checks: a CUDA compute capability, a device name torch parses, and a device this
machine has (:func:`device_problem` says why one cannot be used). torch is imported on the
first check."""

from __future__ import annotations

from typing import Any

from precision_plugin._base.boundary.validators import Validator
from precision_plugin._base.constraints import Invalid


def _capability(value: Any) -> Any:
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in value)
    )
    if value is not None and not ok:
        raise Invalid(
            "is not a GPU compute capability; pass a (major, minor) tuple of integers such as "
            "(8, 0) for an A100 or (9, 0) for an H100, or None for no GPU"
        )
    return value


#: A CUDA compute capability ``(major, minor)``, or ``None`` (no GPU).
gpu_capability = Validator(
    "a (major, minor) tuple such as (8, 0), or None", _capability, ("9.0", (9,), (9, 0, 1), 9.0)
)


def _torch_device(value: Any) -> Any:
    import torch

    try:
        torch.device(value)
    except (RuntimeError, TypeError, ValueError, OverflowError) as exc:  # 2**70: ValueError
        raise Invalid(
            f"is not a torch device ({' '.join(str(exc).split())}); pass 'cuda', 'cpu', "
            f"'cuda:1' or a torch.device"
        ) from None
    return value


#: A device name torch parses (``"cpu"``, ``"cuda:1"``) or a ``torch.device``.
torch_device = Validator("a torch device such as 'cpu' or 'cuda:1'", _torch_device, ("gpu0", ""))


def device_problem(device: Any) -> str | None:
    """Why torch cannot run on ``device`` on this machine ("it is not a torch device (...)",
    "torch sees no CUDA GPU (torch 2.x)", ...); ``None`` where it can. Device types other than
    cpu, cuda, mps and xpu are refused: nothing here runs on them."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError, OverflowError) as exc:
        return f"it is not a torch device ({' '.join(str(exc).split())})"
    xpu = getattr(torch, "xpu", None)
    counts = {
        "cpu": 1,
        "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "mps": 1 if torch.backends.mps.is_available() else 0,
        "xpu": xpu.device_count() if xpu is not None and xpu.is_available() else 0,
    }
    if parsed.type not in counts:
        return "it is not a device the plugin runs on (cpu, cuda, mps or xpu)"
    found = counts[parsed.type]
    if found == 0:
        label = "CUDA GPU" if parsed.type == "cuda" else f"{parsed.type} device"
        return f"torch sees no {label} (torch {torch.__version__})"
    if parsed.index is not None and parsed.index >= found:
        return f"torch sees {found} {parsed.type} device(s) (indices 0..{found - 1})"
    return None


def _usable_device(value: Any) -> Any:
    problem = device_problem(value)
    if problem is not None:
        raise Invalid(
            f"cannot be used on this machine: {problem}; pass 'cpu' or a device torch sees here"
        )
    return value


#: A device torch parses and has on this machine (``"cuda"`` without a CUDA GPU is refused
#: here, not by torch's assertion at the first ``.to()``).
usable_device = Validator(
    "a torch device this machine has, such as 'cpu' or 'cuda:0'", _usable_device, ("gpu0", "")
)
