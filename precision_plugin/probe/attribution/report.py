"""The attribution's results: per dtype, one row per cause, the interaction and the residual."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._core.decision import Attribution
from precision_plugin._core.intervals import COVERAGE
from precision_plugin.probe.attribution.decompose import K3, SHAPLEY_MAX_CAUSES, Part, Shares
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE, FirstChange, change_evidence
from precision_plugin.probe.attribution.settings import RolloutSettings


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


#: How to remove the truncated behaviour policy's bias (``CauseRow.truncation``).
TRUNCATION_FIX = (
    "record the sampled distribution's log-probs: logprobs_mode=processed_logprobs (vLLM "
    "--logprobs-mode processed_logprobs), or sample untruncated: top_p=1, top_k=-1"
)


def truncation_note(mean_log_mass: float, tokens: int) -> str:
    """The sampling row's words for a truncated behaviour policy recorded with raw log-probs:
    the bias of each importance ratio's log (``-log`` of the mass kept, per token) and the
    fix."""
    return (
        f"top-k/top-p with raw_logprobs: the rollout samples from the truncated distribution "
        f"but records the full one's log-probs, so each importance ratio's log is biased by "
        f"-log(mass kept) per token: the mean log mass kept is {mean_log_mass:.3g} nats per "
        f"token over this run's {tokens:,} sampled tokens (a sequence of L tokens: about "
        f"{-mean_log_mass:.3g}*L too large); this row's 0 leaves it out. Fix: {TRUNCATION_FIX}."
    )


#: A part whose interval holds 0, in the table and the JSON.
NOT_DISTINGUISHABLE = "not distinguishable from 0"


def part_note(split: Part | None) -> str:
    """The words a part needs beside its number (``CauseRow.note``)."""
    if split is None:
        return ""
    words = []
    if not split.distinguishable:
        words.append(f"{NOT_DISTINGUISHABLE} ({100 * COVERAGE:g}% interval holds 0)")
    if split.value < 0:
        words.append(
            "negative: switched on with the others it lowers the k3 (it offsets part of them)"
        )
    elif split.share == split.share and split.share > 1:
        words.append("above the total: other parts are negative (they offset part of this one)")
    return "; ".join(words)


def _part_fields(split: Part) -> dict[str, Any]:
    out: dict[str, Any] = {
        "part_interval": [_num(split.low), _num(split.high)],
        "share_interval": [_num(split.share_low), _num(split.share_high)],
        "distinguishable_from_0": split.distinguishable,
    }
    note = part_note(split)
    if note:
        out["note"] = note
    return out


@checked
@dataclass
class CauseRow:
    """One cause in one dtype.

    ``in_total``: the cause is part of this run's rollout (its ``share`` of the measured total
    is given); otherwise the row says what it would add if switched on (``what_if``: how) and
    has no share. ``part``: the cause's part of the k3 total (``split``, its Shapley value or
    sequential saving with their intervals); for a what-if, its own ``k3``. ``k3``: the cause
    switched on alone against the common base. ``bitwise_equal``: the share of tokens whose
    log-probs are bit-identical with and without the cause. ``expert_flips``: MoE only, the
    share of routed positions whose chosen experts differ. ``truncation``: the ``sampling`` row
    of a rollout that truncates (top-k/top-p) and records raw log-probs, the mean over its
    sampled tokens of the log of the mass the truncation kept (``<= 0``; ``-`` it is the bias
    of each token's log importance ratio), with ``truncation_tokens`` the tokens it averages.
    """

    cause: str
    in_total: bool
    k3: K3
    part: float
    share: float | None
    bitwise_equal: float
    tokens: int
    what_if: str = ""
    expert_flips: float | None = None
    truncation: float | None = None
    truncation_tokens: int = 0
    split: Part | None = None

    def note(self) -> str:
        """Words for a part the table must not leave as a bare number: not distinguishable
        from 0, negative, or above the whole total; ``""`` otherwise."""
        return part_note(self.split)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with the cause's fixes)."""
        out: dict[str, Any] = {
            "cause": self.cause,
            "in_total": self.in_total,
            "k3": _num(self.k3.value),
            "k3_interval": [_num(self.k3.low), _num(self.k3.high)],
            "part": _num(self.part),
            "share": _num(self.share) if self.share is not None else None,
            "bitwise_equal": _num(self.bitwise_equal),
            "tokens": self.tokens,
        }
        if self.split is not None:
            out.update(_part_fields(self.split))
        if self.what_if:
            out["what_if"] = self.what_if
        if self.expert_flips is not None:
            out["expert_flips"] = self.expert_flips
        if self.truncation is not None:
            out["truncation"] = {
                "mean_log_mass_kept": _num(self.truncation),
                "tokens": self.truncation_tokens,
                "log_ratio_bias_per_token": _num(-self.truncation),
                "fix": TRUNCATION_FIX,
                "note": truncation_note(self.truncation, self.truncation_tokens),
            }
        out["fixes"] = dict(CAUSE_TABLE[self.cause].fixes)
        return out


@checked
@dataclass
class DtypeAttribution:
    """One dtype: the measured total, each cause's row and the residual (``shares``: the
    Shapley or sequential split of the k3 total; without it, results written before it: parts
    of ``E[d^2]/2`` with an ``interaction``)."""

    dtype: str
    total: K3
    total_part: float
    bitwise_equal: float
    tokens: int
    rows: list[CauseRow]
    interaction: float
    residual: float
    conventions: dict[str, str]
    excluded: int = 0
    seconds: float = 0.0
    layerwise: str | None = None
    #: The log-probs the total compares, per sequence: the trainer's (``pi``) and the rollout's
    #: as configured (``mu``); not in the JSON (the probe measures the rollout as configured
    #: from them).
    trainer_logprobs: list[list[float]] = field(default_factory=list, repr=False)
    rollout_logprobs: list[list[float]] = field(default_factory=list, repr=False)
    shares: Shares | None = None

    def row(self, cause: str) -> CauseRow | None:
        """The row of ``cause`` (``None`` when not measured)."""
        return next((r for r in self.rows if r.cause == cause), None)

    def ranked(self) -> list[CauseRow]:
        """The rows by k3, largest first."""
        return sorted(self.rows, key=lambda r: -(r.k3.value if r.k3.value == r.k3.value else -1))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        share = (lambda x: x / self.total_part) if self.total_part > 0 else (lambda x: None)
        out: dict[str, Any] = {
            "total": {
                "k3": _num(self.total.value),
                "k3_interval": [_num(self.total.low), _num(self.total.high)],
                "part": self.total_part,
                "bitwise_equal": _num(self.bitwise_equal),
                "tokens": self.tokens,
                "excluded_tokens": self.excluded,
            },
            "causes": {r.cause: r.to_dict() for r in self.rows},
        }
        if self.shares is None:
            out["interaction"] = {"part": self.interaction, "share": share(self.interaction)}
            out["residual"] = {"part": self.residual, "share": share(self.residual)}
        else:
            together = self.shares.together
            out["shares"] = self.shares.method
            out["together"] = {
                "k3": _num(together.value),
                "k3_interval": [_num(together.low), _num(together.high)],
                "passes": self.shares.passes,
            }
            residual = self.shares.residual
            out["residual"] = {
                "part": _num(residual.value),
                "share": _num(residual.share),
                **_part_fields(residual),
            }
        out |= {
            "conventions": dict(self.conventions),
            "seconds": round(self.seconds, 3),
        }
        if self.layerwise is not None:
            out["layerwise"] = self.layerwise
        return out


@checked
@dataclass
class AttributionReport:
    """``probe --attribute``: the rollout settings, the learning rate, each dtype's rows."""

    settings: RolloutSettings
    learning_rate: float
    dtypes: dict[str, DtypeAttribution] = field(default_factory=dict)
    first: FirstChange | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def evidence(self) -> Attribution | None:
        """The change-first as the one decision's evidence
        ([`decide`][precision_plugin._core.decision.decide]); ``None`` without one."""
        return change_evidence(self.first, self.first_rows())

    def first_rows(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Each dtype's rows as ``first_change`` reads them (with each share's interval where
        the run has one)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for d, a in self.dtypes.items():
            out[d] = {}
            for r in a.rows:
                row: dict[str, Any] = {"share": r.share, "k3": r.k3.value, "in_total": r.in_total}
                if r.split is not None:
                    row["share_interval"] = [r.split.share_low, r.split.share_high]
                out[d][r.cause] = row
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``attribution`` section."""
        methods = {a.shares.method for a in self.dtypes.values() if a.shares is not None}
        return {
            "method": "each cause's part of the k3 total is its Shapley value over the causes in "
            "the total: v(S) = k3 of the trainer against the rollout rescored with the causes in "
            "S switched on together (v(empty) = 0), on the same tokens; the parts add up to "
            "v(all causes) and residual = total - v(all causes); above "
            f"{SHAPLEY_MAX_CAUSES} causes, the sequential saving in the table's order; each "
            "part, share and the residual with a bootstrap interval over sequences",
            "shares": "sequential" if "sequential" in methods else "shapley",
            "coverage": COVERAGE,
            "rollout": self.settings.to_dict(),
            "learning_rate": self.learning_rate,
            "dtypes": {d: a.to_dict() for d, a in self.dtypes.items()},
            "first_change": self.first.to_dict() if self.first is not None else None,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }
