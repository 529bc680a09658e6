"""Can DeepSpeed's accelerator run the policy dtype here? One answer for ``doctor`` and for
``deepspeed.initialize``.

DeepSpeed refuses an engine whose dtype its accelerator does not support
(``DeepSpeedEngine._do_sanity_check``: "Type fp16 is not supported on your device"). Its CPU
accelerator supports fp16 only where oneDNN has native fp16 kernels
(``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX512-FP16 / AMX-FP16 CPUs), so on most CPUs
an fp16 DeepSpeed run cannot start, although torch itself computes fp16 on any CPU.

When DeepSpeed is imported, its accelerator is asked (``get_accelerator()``); otherwise the
answer is predicted without importing DeepSpeed (slow, and it logs to stdout) by DeepSpeed
0.19's own rules: ``DS_ACCELERATOR``, else xpu, mps, cuda in that order, else cpu.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from precision_plugin._base.conflicts import settle_conflict
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: Accelerator packages DeepSpeed detects before CUDA; with one of them installed the answer is
#: left to DeepSpeed itself.
_VENDOR_PACKAGES = ("torch_npu", "torch_sdaa", "habana_frameworks", "torch_mlu", "torch_supa")


@dataclass(frozen=True)
class DeviceSupport:
    """Which dtypes DeepSpeed's accelerator accepts: ``None`` where it could not be told.

    ``source`` is ``"deepspeed"`` (its accelerator was asked) or ``"predicted"`` (DeepSpeed's
    rules applied without importing it).
    """

    accelerator: str
    fp16: bool | None
    bf16: bool | None
    source: str

    def supports(self, dtype: str) -> bool | None:
        """Whether an engine in ``dtype`` (canonical name) passes DeepSpeed's device check."""
        return {"float16": self.fp16, "bfloat16": self.bf16, "float32": True}[dtype]


def deepspeed_support() -> DeviceSupport:
    """What DeepSpeed's accelerator supports in this process (see the module docstring)."""
    if "deepspeed" in sys.modules:
        try:
            from deepspeed.accelerator import get_accelerator

            acc = get_accelerator()
            return DeviceSupport(
                str(acc.device_name()).split(":")[0],
                bool(acc.is_fp16_supported()),
                bool(acc.is_bf16_supported()),
                "deepspeed",
            )
        except Exception as exc:  # a broken accelerator: fall back to the prediction
            log.debug("DeepSpeed's accelerator could not be asked: %s", exc)
    return _predict()


def _predict() -> DeviceSupport:
    import torch

    name = os.environ.get("DS_ACCELERATOR")
    if name is None:
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            name = "xpu"
        elif any(importlib.util.find_spec(p) is not None for p in _VENDOR_PACKAGES):
            name = "vendor"
        elif torch.backends.mps.is_available():
            name = "mps"
        elif torch.cuda.device_count() > 0 and torch.cuda.is_available():
            name = "cuda"
        else:
            name = "cpu"
    if name == "cpu":
        try:
            fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except Exception:
            fp16 = False
        return DeviceSupport("cpu", fp16, True, "predicted")
    if name == "cuda":
        if not torch.cuda.is_available():
            return DeviceSupport("cuda", True, True, "predicted")
        major, _ = torch.cuda.get_device_capability()
        allow = os.environ.get("DS_ALLOW_DEPRECATED_FP16", "0") == "1"
        fp16 = major >= 7 or (major == 6 and allow)
        return DeviceSupport("cuda", fp16, bool(torch.cuda.is_bf16_supported()), "predicted")
    if name in ("xpu", "mps"):
        bf16 = True if name == "xpu" else None
        return DeviceSupport(name, True, bf16, "predicted")
    return DeviceSupport(name, None, None, "predicted")


def ways_out(policy: PrecisionPolicy, support: DeviceSupport) -> str:
    """The ways to a run DeepSpeed accepts on this accelerator."""
    other = "bfloat16" if policy.dtype == "float16" else "float16"
    consistent = (
        f"consistent {other} on both sides (precision_plugin.enable(dtype={other!r}) or "
        f'PRECISION_PLUGIN={other}, and "dtype": "{other}" in the config\'s '
        f'"precision_plugin" section)'
        if support.supports(other)
        else None
    )
    options = [o for o in (consistent, "float32 (dtype='float32')") if o]
    return " or ".join(options) + f", or a device whose DeepSpeed accelerator runs {policy.dtype}"


def unsupported_message(policy: PrecisionPolicy, support: DeviceSupport) -> str:
    """One sentence: the accelerator, the dtype it refuses, and why."""
    short = {"float16": "fp16", "bfloat16": "bf16"}[policy.dtype]
    why = (
        " (its CPU accelerator needs oneDNN fp16 kernels: an AVX512-FP16 or AMX-FP16 CPU)"
        if support.accelerator == "cpu" and policy.is_fp16
        else ""
    )
    return (
        f"DeepSpeed's {support.accelerator} accelerator does not support {short}{why}, so a "
        f"DeepSpeed engine under the {policy.dtype} policy stops with 'Type {short} is not "
        f"supported on your device'"
    )


def check_engine_dtype(policy: PrecisionPolicy) -> str:
    """Before ``deepspeed.initialize``: the dtype the engine can run here under ``policy``.

    Returns ``policy.dtype`` when the accelerator supports it (or cannot tell). Otherwise
    ``strictness="error"`` raises
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] naming the
    accelerator and the ways out; ``"warn"`` logs that the engine runs float32 instead (one
    dtype on both sides stays the user's decision) and returns ``"float32"``.
    """
    if policy.dtype == "float32":
        return policy.dtype
    support = deepspeed_support()
    if support.supports(policy.dtype) is not False:
        return policy.dtype
    settle_conflict(
        policy.strictness,
        unsupported_message(policy, support),
        fix=ways_out(policy, support),
        outcome=f"this engine runs float32 instead (fp16/bf16 off); for a consistent run use "
        f"{ways_out(policy, support)}",
    )
    return "float32"


#: DeepSpeed's CPU communication op, compiled on first use where no prebuilt one ships.
_CPU_COMM_OP = "deepspeed_shm_comm"


#: The variable torch's JIT builds (DeepSpeed's ops among them) take their cache folder from.
EXTENSIONS_VARIABLE = "TORCH_EXTENSIONS_DIR"


def environment_extensions_dir(environ: Mapping[str, str], prefix: str) -> str | None:
    """The build cache for the environment at ``prefix`` (``sys.prefix``): ``<prefix>/
    torch_extensions``, or ``None`` when the user chose one (``TORCH_EXTENSIONS_DIR`` set).

    torch's default, ``~/.cache/torch_extensions/py311_cpu``, is shared by every environment
    of a user: an op built from another environment's DeepSpeed is rebuilt (minutes on a small
    CPU) on every switch between them, each time over the other's build."""
    if environ.get(EXTENSIONS_VARIABLE):
        return None
    return os.path.join(prefix, "torch_extensions")


def build_due(folder: str, sources: str | None) -> bool:
    """Whether torch will (re)build DeepSpeed's CPU op in ``folder``: no library there yet, or
    one built from another environment's DeepSpeed (its ``build.ninja`` does not name
    ``sources``, this environment's DeepSpeed folder; ``None``: not known)."""
    if not os.path.isfile(os.path.join(folder, f"{_CPU_COMM_OP}.so")):
        return True
    ninja = os.path.join(folder, "build.ninja")
    if sources is None or not os.path.isfile(ninja):
        return False
    with open(ninja, encoding="utf-8", errors="replace") as recipe:  # torch's own file
        return sources not in recipe.read()


def pending_cpu_build() -> str | None:
    """The folder DeepSpeed will compile its CPU communication op into on this run (a few
    minutes on a small CPU; later runs load it from there), or ``None`` when no build is due
    (another accelerator, a prebuilt op, or one compiled already from this environment)."""
    if deepspeed_support().accelerator != "cpu":
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = _get_build_directory(_CPU_COMM_OP, verbose=False)
    except Exception:  # torch's private helper moved: say nothing rather than guess
        return None
    spec = importlib.util.find_spec("deepspeed")
    sources = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    return folder if build_due(folder, sources) else None


def build_notice(folder: str) -> str:
    """One sentence for a user about to wait for DeepSpeed's first CPU build."""
    return (
        f"DeepSpeed compiles its CPU communication op ({_CPU_COMM_OP}) on this first run: "
        f"expect 2-5 minutes of silence on a small CPU; it is cached in {folder} for later runs"
    )
