"""``precision-plugin doctor`` findings for verl: version, what it supports, the default config.

Reads verl's own default ``ppo_trainer`` YAML files from the installed package (no ``import
verl``, which starts Ray's import machinery) and runs the config check on what a bare
``main_ppo`` run would get.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from precision_plugin._base import versions
from precision_plugin._base.report import Finding
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.verl.check import find_contradictions
from precision_plugin.verl.layout import ENTRY_POINT_GROUP, ENTRY_POINT_NAME, layout


def default_config() -> dict[str, Any] | None:
    """verl's flattened default config (``_generated_ppo_trainer.yaml``), or ``None``."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    path = path / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception:
        return None
    return data if isinstance(data, dict) else None


def entry_point_registered() -> bool:
    """True when an installed distribution registers ``precision_plugin`` in ``verl.plugins``."""
    return versions.entry_point_registered(ENTRY_POINT_GROUP, ENTRY_POINT_NAME)


def doctor_findings(policy: PrecisionPolicy) -> list[Finding]:
    """Findings for ``doctor``; empty when verl is not installed."""
    info = versions.package_info("verl")
    if info is None:
        return []
    lay = layout(info.version)
    gen = (
        "legacy FSDP workers (fsdp_config.dtype)" if lay.legacy else "FSDP engine (mixed_precision)"
    )
    findings = [
        Finding(
            "verl",
            "info",
            f"verl {info.version} installed: {gen}; run it with "
            f"$(precision-plugin verl-overrides --dtype {policy.dtype})",
            details={"version": str(info.version)},
        )
    ]
    cfg = default_config()
    if cfg is not None:
        problems = find_contradictions(cfg, policy, verl_version=info.version)
        if problems:
            findings.append(
                Finding(
                    "verl",
                    "change",
                    f"verl's default ppo_trainer config contradicts the {policy.dtype} policy in "
                    f"{len(problems)} place(s): " + "; ".join(p.message for p in problems),
                    fix="append $(precision-plugin verl-overrides) to the verl command line",
                )
            )
        else:
            findings.append(Finding("verl", "ok", f"verl's defaults match {policy.dtype}"))
    if lay.plugins:
        registered = entry_point_registered()
        findings.append(
            Finding(
                "verl",
                "ok" if registered else "warning",
                "verl.plugins entry point registered: each verl worker checks its config"
                if registered
                else "the verl.plugins entry point is not registered (a partial or stale "
                "install?), so verl workers do not check their config",
                fix=""
                if registered
                else "pip install <path to the precision_plugin repository> (or a wheel "
                "built from it) in this environment",
            )
        )
    else:
        findings.append(
            Finding(
                "verl",
                "info",
                f"verl {info.version} loads no verl.plugins entry points (from 0.9); for the "
                f"in-worker check add ++ray_kwargs.ray_init.runtime_env.env_vars."
                f"VERL_USE_EXTERNAL_MODULES=precision_plugin.verl.plugin",
            )
        )
    return findings
