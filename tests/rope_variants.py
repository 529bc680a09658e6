"""The scaled RoPE variants transformers has, as ``rope_parameters`` for a small Llama whose
``max_position_embeddings`` is 512: an original context of 128 where the variant has one, so
positions up to 4,096 cross both (dynamic recomputes past 512, longrope switches past 128).
Shared by tests/unit/test_buffers.py and tests/contract/test_vllm_contract.py."""

from __future__ import annotations

from typing import Any

SCALED: dict[str, dict[str, Any]] = {
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 4.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 128},
    "longrope": {"short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [2.0 + i for i in range(8)],
                 "original_max_position_embeddings": 128},
}  # fmt: skip


def rope_parameters(rope_type: str) -> dict[str, Any]:
    """``rope_parameters`` for ``rope_type`` (``default`` or a key of ``SCALED``), theta 1e4."""
    return {"rope_type": rope_type, "rope_theta": 10000.0, **SCALED.get(rope_type, {})}
