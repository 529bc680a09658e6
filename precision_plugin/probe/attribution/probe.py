"""The attribution inside a probe run: which samples each dtype attributes, and the report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from precision_plugin._core.scoring.packed_cpu import trainer_kernels
from precision_plugin.probe.attribution.measure import attribute, rollout_samples
from precision_plugin.probe.attribution.report import AttributionReport, DtypeAttribution
from precision_plugin.probe.attribution.settings import AttributionSettings, RolloutSettings
from precision_plugin.probe.attribution.variants import apply_switches, has_rope


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
    (the same tokens and log-probs, which are also the decode row's decode side); otherwise the
    HF engine samples again with the settings
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
    if len(prompts) < 2:
        notes.append(
            "attribution: one sequence: no batch row (a sequence alone against inside its "
            "batch needs two) and no intervals (they resample whole sequences); pass "
            "--num-prompts 2 or more."
        )
    if not has_rope(model):
        notes.append(
            "attribution: the model keeps no RoPE frequencies (no inv_freq buffer: learned or "
            "ALiBi positions), so there is no rope row."
        )
    samples: dict[str, Any] = {}
    for dtype, result in results.items():
        if not result.samples:
            continue
        if not reuse:
            tick(f"{dtype}: attribution: rollout with the --rollout settings", 0)
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
        phase=lambda what: tick(what, 0),
        recorded_decode=reuse,
        # the probe's trainer forward scored these very samples as the attribution's trainer
        # side does (default settings): its log-probs are reused, not computed again
        trainer={d: results[d].train_logprobs for d in samples} if reuse else None,
    )
    report.notes.extend(notes)
    if config.layerwise:
        for dtype, block in report.dtypes.items():
            block.layerwise = where_it_parts(model, block, samples[dtype], settings, config)
            tick(f"{dtype}: attribution layerwise", 0)
    return report


#: Causes that are a difference inside one forward pass, which the layer-wise replay can place
#: (decode, batch, sampling and stale weights are not: another pass, batch or distribution).
LAYER_CAUSES = ("dtype", "rope", "kv_cache", "router", "lm_head")


def where_it_parts(
    model: Any,
    block: DtypeAttribution,
    samples: Sequence[Any],
    settings: RolloutSettings,
    config: Any,
) -> str | None:
    """For the largest cause in ``block``'s total that lives inside one forward, replay the
    longest sample layer by layer (``layerwise.replay``) with and without it: one sentence."""
    from precision_plugin.probe.attribution.measure import _copy, present_switches
    from precision_plugin.probe.layerwise import longest, replay

    rows = sorted(
        (r for r in block.rows if r.in_total and r.share is not None),
        key=lambda r: -r.share,  # type: ignore[operator]
    )
    # A cause whose row is exactly 0 has nothing to place (float32's dtype row, for one).
    placeable = [r for r in rows if r.cause in LAYER_CAUSES and r.part > 0]
    sample = longest(samples)
    if sample is None:
        return None
    if not placeable:
        return (
            "no cause inside one forward (" + ", ".join(LAYER_CAUSES) + ") adds to this "
            "total; nothing to place along the layers."
        )
    cause = placeable[0].cause
    dtype = block.dtype
    device = str(next(model.parameters()).device)
    base = apply_switches(_copy(model, dtype), model, dtype)
    if cause == "dtype":
        trainer, rollout = model, base
    else:
        key = {"rope": "rope_dtype", "kv_cache": "kv_format", "router": "router_dtype",
               "lm_head": "head_dtype"}[cause]  # fmt: skip
        switch = {key: present_switches(settings, dtype)[key]}
        trainer, rollout = base, apply_switches(_copy(model, dtype), model, dtype, **switch)
    # With the trainer's kernels on both sides, as the rows are measured: otherwise the replay
    # places the rollout kernels' summation order, which is no cause (float32's dtype row is 0).
    with trainer_kernels():
        found = replay(trainer, rollout, sample, dtype, device,
                       margin_bits=config.overflow.margin_bits)  # fmt: skip
    lead = f"largest cause {rows[0].cause}" + (
        f" is not inside one forward; the largest that is, {cause}" if rows[0].cause != cause
        else ""
    )  # fmt: skip
    return f"{lead}: {found.line}"
