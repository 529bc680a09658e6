"""The attribution inside a probe run: which samples each dtype attributes, and the report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from precision_plugin.probe.attribution.measure import attribute, rollout_samples
from precision_plugin.probe.attribution.report import AttributionReport
from precision_plugin.probe.attribution.settings import AttributionSettings, RolloutSettings


def attribute_probe(
    config: Any,
    model: Any,
    prompts: list[list[int]],
    budgets: list[int],
    results: dict[str, Any],
    tick: Callable[[str, int], None],
) -> AttributionReport:
    """Attribute each measured dtype's mismatch (``config``: the probe's ``ProbeConfig``).

    With the default rollout settings and the HF engine, the probe's own samples are attributed
    (the same tokens and log-probs); otherwise the HF engine samples again with the settings
    applied (``rollout_samples``). A dtype the probe did not run (float16 beyond its range) is
    left out.
    """
    wanted: AttributionSettings = config.attribution
    settings = wanted.rollout
    reuse = settings == RolloutSettings() and config.engine == "hf"
    notes = []
    if config.engine != "hf":
        notes.append(
            f"attribution: the {config.engine} engine cannot be switched cause by cause from "
            f"here; the HF engine stands in for it (its samples, its KV cache)."
        )
    samples: dict[str, Any] = {}
    for dtype, result in results.items():
        if not result.samples:
            continue
        samples[dtype] = (
            result.samples
            if reuse
            else rollout_samples(
                model, prompts, budgets, dtype, settings,
                max_new_tokens=config.max_new_tokens,
                min_new_tokens=config.min_new_tokens,
                seed=config.seed,
            )
        )  # fmt: skip
    report = attribute(
        model,
        samples,
        settings,
        min_new_tokens=config.min_new_tokens,
        learning_rate=wanted.learning_rate,
        seed=config.seed,
        tick=lambda what: tick(what, 1),
    )
    report.notes.extend(notes)
    return report
