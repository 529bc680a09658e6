"""What a bad input must not change, measured: the active policy, every patch, the environment,
the import hooks, the framework attributes the plugin patches, and the changes training-time
code made on user objects (fp32 wrappers, detector hooks, telemetry wrappers). Shared by the
bad-input catalogue and the property tests of the public API."""

from __future__ import annotations

import os
import sys
from typing import Any

from precision_plugin._core.manager import active_patches, current_policy

_WATCHED = [
    ("transformers.training_args", "TrainingArguments", "__post_init__"),
    ("transformers.trainer", "Trainer", "__init__"),
    ("transformers.trainer", "Trainer", "train"),
    ("accelerate.accelerator", "Accelerator", "__init__"),
    ("accelerate.accelerator", "Accelerator", "prepare_model"),
]


def snapshot() -> dict[str, Any]:
    """What a bad input must not change."""
    from precision_plugin._base.patching import tracked

    watched = {}
    for module, owner, name in _WATCHED:
        mod = sys.modules.get(module)
        target = getattr(mod, owner, None) if mod is not None else None
        if target is not None:
            watched[f"{module}.{owner}.{name}"] = target.__dict__.get(name)
    if "deepspeed" in sys.modules:
        watched["deepspeed.initialize"] = sys.modules["deepspeed"].__dict__.get("initialize")
    return {
        "policy": current_policy(),
        "patches": active_patches(),
        "tracked": tracked(),
        "env": dict(os.environ),
        "meta_path": list(sys.meta_path),
        "watched": watched,
    }


def assert_unchanged(then: dict[str, Any], what: str) -> None:
    """Same policy, patches, tracked changes, environment and import hooks; same framework
    attributes (those of modules imported since are new, not changed)."""
    now = snapshot()
    for key in ("policy", "patches", "tracked", "env", "meta_path"):
        assert now[key] == then[key], f"{what}: {key}: {then[key]!r} -> {now[key]!r}"
    for name, value in then["watched"].items():
        assert now["watched"].get(name) is value, f"{what}: {name}"


def model_untouched(model: Any) -> bool:
    """True when no module of ``model`` carries a hook or an instance ``forward``."""
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and "forward" not in vars(m)
        for m in model.modules()
    )
