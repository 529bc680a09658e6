"""Which orchestrator built an engine's arguments: knowledge the engine adapters need about
the frameworks that drive them, kept below both (layer 2) so an engine never imports an
orchestrator. ``precision_plugin.openrlhf.layout`` re-exports its entry.
"""

from __future__ import annotations

from typing import Any


def built_by_openrlhf(engine_args: Any) -> bool:
    """True for a vLLM ``EngineArgs`` that OpenRLHF's ``create_vllm_engines`` built (its
    ``dtype="bfloat16"`` is then OpenRLHF's hard-coded value, not a request of the user)."""
    extension = getattr(engine_args, "worker_extension_cls", None)
    return isinstance(extension, str) and extension.startswith("openrlhf.")
