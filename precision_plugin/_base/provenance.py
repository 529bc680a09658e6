"""Where a published figure came from: the command, the date, the versions and the machine.

Every results file the project publishes (``docs/results/<name>.json``) carries a
``"provenance"`` section written by the command that produced it, so a reader can rerun it and
the docs tables rendered from the file (``scripts/render_docs.py``) can say what ran where.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from precision_plugin._base.versions import FRAMEWORKS, installed_version

#: The key results files keep their provenance under.
KEY = "provenance"


def provenance(command: str | Sequence[str]) -> dict[str, Any]:
    """The provenance of a result produced now by ``command`` (a string, or argv words).

    ``{"command", "date" (UTC, ISO 8601), "versions" (precision_plugin and every installed
    framework it knows), "machine" (platform, Python, CPU count, CPU model, load average, CPU
    kernels: :func:`cpu_kernels`)}``.
    """
    if not isinstance(command, str):
        command = shlex.join(str(word) for word in command)
    versions = {"precision_plugin": installed_version("precision_plugin")}
    versions |= {name: installed_version(name) for name in FRAMEWORKS}
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        load = None
    return {
        "command": command,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {k: str(v) for k, v in versions.items() if v is not None},
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "load_average": load,
            "kernels": cpu_kernels(),
        },
    }


#: Environment variables that cap the CPU kernels torch, oneDNN and MKL choose (read when torch
#: is imported); results files record the ones set.
KERNEL_CAPS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
)


def cpu_model() -> str | None:
    """The CPU's model name (``AMD EPYC 7B13``), from ``/proc/cpuinfo`` on Linux, else what
    ``platform.processor()`` says; ``None`` where neither says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:  # the kernel's
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_kernels() -> dict[str, Any]:
    """Which CPU kernels computed a result: torch's kernel capability
    (``torch.backends.cpu.get_cpu_capability()``: ``DEFAULT``, ``AVX2``, ``AVX512``...), whether
    oneDNN has native float16 and bfloat16 kernels here (feature-detected; DeepSpeed's CPU
    accelerator runs fp16 only with them) and the kernel caps set in the environment.

    Rounding, hence a mismatch measured on a CPU, depends on these: docs/testing.md says which
    published figures vary with them and by how much. ``None`` for what could not be asked.
    """
    out: dict[str, Any] = {"capability": None, "onednn_fp16": None, "onednn_bf16": None}
    try:
        import torch

        out["capability"] = str(torch.backends.cpu.get_cpu_capability())
        for key, name in (("onednn_fp16", "fp16"), ("onednn_bf16", "bf16")):
            try:
                out[key] = bool(getattr(torch.ops.mkldnn, f"_is_mkldnn_{name}_supported")())
            except Exception:  # an op missing from this torch build: unknown, not False
                out[key] = None
    except Exception:  # pragma: no cover - torch absent or broken
        pass
    out["caps"] = {k: os.environ[k] for k in KERNEL_CAPS if k in os.environ}
    return out


def cli_command(argv: Sequence[str], program: str = "precision-plugin") -> str:
    """The command line a user typed to run ``program`` with ``argv`` (its arguments)."""
    return shlex.join([program, *map(str, argv)])


def with_provenance(data: Mapping[str, Any], command: str | Sequence[str]) -> dict[str, Any]:
    """``data`` with its ``"provenance"`` section for ``command`` (added last)."""
    return {**data, KEY: provenance(command)}


def write_results(
    path: str | os.PathLike[str], data: Mapping[str, Any], command: str | Sequence[str]
) -> Path:
    """Write ``data`` with its provenance as indented JSON to ``path`` (atomically: a temporary
    file and a rename); returns the path."""
    from precision_plugin._base.outputs import write_atomic

    text = json.dumps(with_provenance(data, command), indent=2, allow_nan=False) + "\n"
    return write_atomic(path, text)
