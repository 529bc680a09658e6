"""The probe's overflow side: measured float16 headroom on the probe prompts, next to the
list-based ``model_type`` risk check (vLLM's fp16 refusals, families known to overflow)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._base.report import Finding
from precision_plugin._core.overflow import HeadroomReport, headroom
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")


@dataclass
class OverflowCheck:
    """Headroom measured on the probe prompts, and the ``model_type`` findings beside it."""

    report: HeadroomReport
    model_type: str | None = None
    risks: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``headroom`` key of the probe JSON: the report (every module, in execution
        order), the ``model_type`` and its list-based findings."""
        return {
            **self.report.to_dict(),
            "model_type": self.model_type,
            "model_type_risks": [f.to_dict() for f in self.risks],
        }


def check_overflow(
    model: Any, prompts: list[list[int]], path: str, margin_bits: float
) -> OverflowCheck:
    """Run :func:`~precision_plugin._core.overflow.headroom` on ``prompts`` (one batch each) and the
    ``model_type`` check of the checkpoint at ``path`` for a float16 policy."""
    import torch

    from precision_plugin._core.model_risks import model_findings

    device = next(model.parameters()).device
    batches = [torch.tensor([ids], device=device) for ids in prompts]
    report = headroom(model, batches, margin_bits=margin_bits)
    fp16 = PrecisionPolicy(dtype="float16")
    findings = model_findings(path, fp16, raise_on_refusal=False)
    risks = [f for f in findings if f.status in ("warning", "error")]
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return OverflowCheck(report, model_type, risks)
