"""Each cause of the remaining mismatch, what it is, and the setting that removes it, in each
framework's own keys where the plugin knows them; and which to change first.

Keys are those read in the frameworks' sources and docs (``/work/shared/research``): where a
framework has no switch for a cause the table says so rather than invent one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._core.decision import Attribution
from precision_plugin.errors import PrecisionConfigError

#: The cause ids of the ``attribution`` section, in the order the table lists them.
CAUSES: tuple[str, ...] = (
    "dtype",
    "decode",
    "batch",
    "lm_head",
    "sampling",
    "rope",
    "kv_cache",
    "router",
    "stale_weights",
)


@checked
@dataclass(frozen=True)
class Cause:
    """One cause: what it is, what the switch compares, and the settings that remove it."""

    id: str
    what: str
    switch: str
    fixes: dict[str, str]
    #: Whether a user setting can remove it (the first-change advice skips the others).
    settable: bool = True


CAUSE_TABLE: dict[str, Cause] = {
    c.id: c
    for c in (
        Cause(
            "dtype",
            "rounding in the compute dtype: the rollout's dtype weights against the trainer's "
            "autocast over float32 master weights",
            "both sides in the dtype vs both in float32",
            {
                # how much less than bfloat16: measured in each run (render.dtype_fix)
                "precision_plugin": "pp.enable() (float16 on both sides)",
                "TRL": "GRPOConfig(fp16=True) with pp.enable() (the colocated vLLM follows)",
                "verl": "actor_rollout_ref.rollout.dtype=float16 and "
                "++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16",
                "OpenRLHF": "--ds.param_dtype fp16 (vLLM is hard-coded to bfloat16: "
                "pp.enable() changes it)",
                "vLLM": "--dtype float16",
                "SGLang": "--dtype float16",
            },
        ),
        Cause(
            "decode",
            "log-probs recorded while decoding with the KV cache against one prefill pass of "
            "the same tokens (other matmul shapes, other rounding)",
            "KV-cache incremental decode vs one prefill pass",
            {
                "vLLM": "no switch; VLLM_BATCH_INVARIANT=1 (batch-invariant kernels) is the route "
                "to equal numerics",
                "SGLang": "--enable-deterministic-inference (with --rl-on-policy-target fsdp)",
                "any": "recompute the behaviour log-probs with the trainer (old_log_prob) and "
                "keep the rollout's only for the IS correction",
            },
            settable=False,
        ),
        Cause(
            "batch",
            "a sequence scored alone against inside its padded batch (batch-dependent kernels)",
            "alone vs inside the padded batch",
            {
                "vLLM": "VLLM_BATCH_INVARIANT=1",
                "SGLang": "--enable-deterministic-inference",
                "verl": "actor_rollout_ref.rollout.full_determinism=true (sets "
                "VLLM_BATCH_INVARIANT=1; verl 0.7 has no such key)",
            },
        ),
        Cause(
            "lm_head",
            "the LM head's logits in float32 on one side only",
            "LM head in float32 on one side vs the same precision on both",
            {
                "TRL": "cast_lm_head_to_fp32=True (trainer side) together with an fp32 head in "
                "the engine, or neither",
                "SGLang": "--enable-fp32-lm-head on the engine only together with the trainer's "
                "fp32 head, or neither",
                "vLLM": "no engine flag; keep the trainer's head in the compute dtype "
                "(TRL cast_lm_head_to_fp32=False)",
                "--rollout": "lm_head_fp32=false",
            },
        ),
        Cause(
            "sampling",
            "the rollout's temperature/top-p/top-k/log-prob mode applied on one side only. "
            "Conventions: vLLM raw_logprobs are log_softmax(logits) before temperature; "
            "processed_logprobs after temperature, top-k and top-p (renormalised); TRL's "
            "trainer (and this probe's trainer side) divides the logits by the temperature "
            "and applies no top-k/top-p",
            "the rollout's log-prob convention vs the trainer's, on tokens sampled under them",
            {
                "vLLM": "logprobs_mode=processed_logprobs with top_p=1.0, top_k=-1 when the "
                "trainer divides by the temperature (TRL, verl)",
                "TRL": "GRPOConfig(top_p=1.0, top_k=0) (the trainer cannot renormalise)",
                "verl": "actor_rollout_ref.rollout.top_p=1.0 and top_k=-1",
                "--rollout": "top_p=1,top_k=-1,logprobs_mode=processed_logprobs",
            },
        ),
        Cause(
            "rope",
            "RoPE inverse frequencies rounded to the compute dtype (a plain .to(dtype), "
            "DeepSpeed zero.Init); vLLM keeps them in float32",
            "inv_freq rounded vs float32",
            {
                "precision_plugin": "pp.enable() (keeps inv_freq in float32 in every copy it "
                "casts; buffers.cast_model)",
                "DeepSpeed": "precision_plugin.deepspeed (restores float32 frequencies after "
                "zero.Init)",
            },
        ),
        Cause(
            "kv_cache",
            "an fp8 KV cache (keys and values rounded to e4m3 or e5m2, scale 1)",
            "fp8 KV cache vs the compute dtype",
            {
                "vLLM": "--kv-cache-dtype auto",
                "SGLang": "--kv-cache-dtype auto",
                "verl": "++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=auto",
                "--rollout": "kv_cache_dtype=auto",
            },
        ),
        Cause(
            "router",
            "an MoE router computed in the compute dtype on one side and in float32 on the "
            "other (the experts chosen can flip)",
            "router in the compute dtype vs float32",
            {
                "Megatron (slime, verl-megatron)": "--moe-router-dtype fp32 on the trainer, "
                "with an fp32 router in the engine, or neither",
                "any": "the same router precision on both sides",
            },
        ),
        Cause(
            "stale_weights",
            "the rollout weights one optimiser step behind the trainer's (a scale to read "
            "in-training numbers against, not a precision effect)",
            "weights one Adam step behind vs the same weights",
            {
                "any": "synchronise weights before every rollout (no async/off-policy steps), "
                "or keep the importance-sampling correction on",
                "TRL": "vllm_importance_sampling_correction=True",
            },
            settable=False,
        ),
    )
}


@checked
@dataclass(frozen=True)
class FirstChange:
    """The setting to change first: the largest cause a setting can remove."""

    dtype: str
    cause: str
    share: float
    k3: float
    settings: dict[str, str]
    #: The share's bootstrap interval (``None``: results without one).
    share_interval: tuple[float, float] | None = None
    #: Other settable causes of the same total, separated from 0, whose share intervals overlap
    #: this one's: the run does not rank ``cause`` above them. ``{cause: (share, low, high)}``.
    tied: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the advice: which setting to change first and why."""
        where = "; ".join(f"{k}: {v}" for k, v in self.settings.items())
        interval = _interval_text(self.share_interval)
        tied = (
            f"; not ranked above {', '.join(self.tied)}: their intervals overlap"
            if self.tied
            else ""
        )
        return (
            f"change first ({self.dtype}): {self.cause} ({self.share:.0%}{interval} of the "
            f"mismatch{tied}, k3 {self.k3:.2e}): {where}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _interval_text(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return ""
    return f" [{interval[0]:.0%}, {interval[1]:.0%}]"


def _separated(row: Mapping[str, Any]) -> tuple[float, float] | bool | None:
    """A row's share interval: ``None`` where the row has none (results written before the
    intervals), ``False`` where it holds 0 or is missing a bound (one sequence)."""
    interval = row.get("share_interval")
    if interval is None:
        return None
    low, high = interval
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
        return False
    if not (low > 0):  # NaN or at most 0: not distinguishable from 0
        return False
    return float(low), float(high)


@checked
def first_change(rows: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> FirstChange | None:
    """The first setting to change, from each dtype's attribution rows (``{dtype: {cause:
    {"share": ..., "k3": ..., "in_total": ...}}}``): among the causes in the measured total that
    a setting can remove, the one with the largest share, in the low-precision dtype with the
    largest such share (float32, the reference, only when it is the only dtype measured).
    ``None`` when no settable cause is in any total with a share above 0. A NaN share is one of
    them: ``Decomposition.share`` gives it when the total is 0 (the two sides agree on every
    token, float32's can), so there is nothing to remove. Where a row carries its share's
    bootstrap interval (``"share_interval": [low, high]``), only a cause whose interval
    separates from 0 (``low > 0``) is named, and the causes of the same total whose intervals
    overlap the one named are its ``tied`` (not ranked below it). Refuses a cause not in
    ``CAUSES``."""
    for dtype, causes in rows.items():
        unknown = [c for c in causes if c not in CAUSE_TABLE]
        if unknown:
            raise PrecisionConfigError(
                f"first_change(): argument 'rows' names the cause {unknown[0]!r} under "
                f"{dtype!r}, expected one of {', '.join(CAUSES)} (fix: key each dtype's rows "
                f"by the attribution's cause ids)."
            )
    best: FirstChange | None = None
    low = {d: causes for d, causes in rows.items() if d != "float32"} or rows
    for dtype, causes in low.items():
        for cause, row in causes.items():
            spec = CAUSE_TABLE[cause]
            share = row.get("share")
            if not spec.settable or not row.get("in_total") or share is None:
                continue
            if cause == "dtype" and dtype != "bfloat16":  # float16 is already the remedy
                continue
            if share != share or share <= 0:  # NaN (a total of 0) or nothing
                continue
            interval = _separated(row)
            if interval is False:  # not distinguishable from 0
                continue
            if best is None or share > best.share:
                best = FirstChange(
                    dtype, cause, float(share), float(row["k3"]), spec.fixes,
                    interval if isinstance(interval, tuple) else None,
                )  # fmt: skip
    if best is None or best.share_interval is None:
        return best
    low = best.share_interval[0]
    tied: dict[str, tuple[float, float, float]] = {}
    for cause, row in rows[best.dtype].items():
        spec = CAUSE_TABLE[cause]
        if cause in (best.cause, "dtype") or not spec.settable or not row.get("in_total"):
            continue
        interval = _separated(row)
        if isinstance(interval, tuple) and interval[1] >= low:
            tied[cause] = (float(row["share"]), *interval)
    return dataclasses.replace(best, tied=tied) if tied else best


#: Which framework's key comes first where a cause lists several (the probe's own first).
FIX_ORDER = ("--rollout", "precision_plugin", "vLLM", "TRL", "SGLang", "verl", "any")
#: The setting's name where a cause has no ``--rollout`` key to take it from.
_SETTING = {
    "dtype": "dtype",
    "batch": "batch invariance",
    "rope": "RoPE frequencies (float32)",
    "router": "router dtype",
}


def setting_name(cause: str) -> str:
    """The setting a cause's fix changes: the ``--rollout`` keys (``kv_cache_dtype``; ``top_p,
    top_k, logprobs_mode``), else a short name."""
    rollout = CAUSE_TABLE[cause].fixes.get("--rollout")
    if rollout:
        return ", ".join(part.split("=")[0] for part in rollout.split(","))
    return _SETTING.get(cause, cause)


def ordered_keys(fixes: Mapping[str, str]) -> dict[str, str]:
    """A cause's fixes with the probe's ``--rollout`` and the best-known frameworks first."""
    known = {k: fixes[k] for k in FIX_ORDER if k in fixes}
    return {**known, **{k: v for k, v in fixes.items() if k not in known}}


@checked
def change_evidence(
    first: FirstChange | None, rows: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> Attribution | None:
    """The attribution's evidence for the one decision
    ([`decide`][precision_plugin._core.decision.decide]): the first change, with the compute dtype's
    own share in the same dtype's total (``rows`` as for ``first_change``)."""
    if first is None:
        return None
    own = rows.get(first.dtype, {}).get("dtype", {})
    share = own.get("share") if own.get("in_total") else None
    own_interval = own.get("share_interval") if own.get("in_total") else None
    return Attribution(
        first.dtype,
        first.cause,
        first.share,
        setting_name(first.cause),
        ordered_keys(first.settings),
        float(share) if share is not None and share == share else 0.0,
        share_interval=first.share_interval,
        dtype_interval=_bounds(own_interval),
        tied={setting_name(c): v for c, v in first.tied.items()},
    )


def _bounds(interval: Any) -> tuple[float, float] | None:
    """``[low, high]`` of a JSON row as floats (NaN for a missing bound); ``None`` without."""
    if interval is None:
        return None
    return tuple(math.nan if x is None else float(x) for x in interval)  # type: ignore[return-value]
