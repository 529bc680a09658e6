"""One decision from everything a probe measured: which dtype to train in, and how to say so.

The evidence is weighed in a fixed order, and the first that decides wins:

1. **overflow**: a dtype that cannot run (float16 activations beyond its range; a rollout
   engine that refuses it for the model type) is out, whatever else it measures;
2. **headroom**: modules within the margin of float16's maximum make float16 conditional on
   ``overflow.keep_fp32_modules`` for where it starts, or rule it out (too many places);
3. **consequence**, with its interval: the share of a batch that still counts at the target
   length; one dtype is preferred only when its interval lies wholly above the other's;
4. **the mismatch itself**: the k3 KL, with its interval, when the consequences cannot be told
   apart;
5. **the attribution** (``probe --attribute``), when it ran: the rollout setting to change
   first (an fp8 KV cache, top-p with processed log-probs, ...). When that setting's share of
   the mismatch is at least the compute dtype's own, the line starts with it ("change
   kv_cache_dtype first") and the dtype advice of 3-4 follows as "then ..."; a dtype that
   cannot run (1) or is ruled out by headroom (2) still leads, with the setting after it. When
   the dtype's rounding dominates, the dtype advice stands alone (the attribution agrees with
   it when it splits bfloat16 and float16 is chosen).

A line changes only on a difference its interval supports; otherwise it says "not enough
sequences to decide" and how many prompts would decide it (interval widths shrink about as
``1/√n``). The decision carries how to apply it in the three ways the plugin is configured:
Python (``enable(...)``), the DeepSpeed config entry, and the ``PRECISION_PLUGIN`` environment
variable (policy fields ``dtype`` and ``overflow.keep_fp32_modules``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import annotated_types as at

from precision_plugin._base.boundary import checked, dtype_name, policy_field
from precision_plugin._base.constraints import Whole
from precision_plugin._core.intervals import Interval

#: Largest --num-prompts the probe accepts: the one definition (layer 2, for
#: ``prompts_to_decide``); ``probe.schema`` and ``probe.inputs`` import it.
MAX_NUM_PROMPTS = 100_000
#: The probe's negligible line: under 1 % of the batch lost.
NEGLIGIBLE = 0.01
#: Order the dtypes are named in when nothing else ranks them.
PREFERENCE = ("float16", "bfloat16")


@checked
@dataclass(frozen=True)
class Evidence:
    """One low-precision dtype's figures for the decision.

    ``kept``: the share of a batch that still counts at the target length, with its
    [`Interval`][precision_plugin._core.intervals.Interval]; ``k3``: the mismatch, with its
    interval;
    ``sequences``: how many sequences
    stand behind them; ``blocked``: why the dtype cannot run (empty when it can); ``verdict``:
    the consequence verdict (negligible ... severe).
    """

    dtype: str
    kept: Interval
    k3: Interval
    sequences: int
    verdict: str
    blocked: str = ""


@checked
@dataclass(frozen=True)
class Headroom:
    """The float16 headroom's recommendation: ``action`` as
    [`Recommendation`][precision_plugin._core.overflow.headroom.Recommendation] (``none``,
    ``keep_fp32_modules``, ``bfloat16``, ``fix_model``), its ``modules``, ``flagged`` (how many
    modules are within the margin) and the margin in bits."""

    action: str = "none"
    modules: tuple[str, ...] = ()
    flagged: int = 0
    margin_bits: float = 3.0
    message: str = ""


@checked
@dataclass(frozen=True)
class Attribution:
    """The attribution's evidence, as data built by the probe: in ``dtype``'s mismatch, the
    largest ``cause`` a user setting removes, its ``share``, the compute dtype's own share
    ``dtype_share`` in the same total, the ``setting`` to change (``kv_cache_dtype``) and the
    ``keys`` that change it, by framework (the probe's ``--rollout`` first). Where the probe
    measured them: ``share_interval`` and ``dtype_interval``, the two shares' bootstrap
    intervals, and ``tied``, the other settings (``{setting: (share, low, high)}``) whose
    intervals overlap ``share_interval``, which the run does not rank below this one."""

    dtype: str
    cause: str
    share: float
    setting: str
    keys: dict[str, str] = field(default_factory=dict)
    dtype_share: float = 0.0
    share_interval: tuple[float, float] | None = None
    dtype_interval: tuple[float, float] | None = None
    tied: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def dominates(self) -> bool:
        """A rollout setting (not the dtype) whose share is at least the dtype's own; with both
        intervals, one whose interval lies above the dtype's (the run ranks it first)."""
        if self.cause == "dtype" or not math.isfinite(self.share):
            return False
        if self.share_interval is not None and self.dtype_interval is not None:
            above = self.dtype_interval[1]
            return math.isfinite(above) and self.share_interval[0] > above
        own = self.dtype_share if math.isfinite(self.dtype_share) else 0.0
        return self.share >= own

    def clause(self) -> str:
        """``change <setting> first (<share> of the <dtype> mismatch, ...): <keys>``; with the
        intervals, each share with its interval and the tied settings named."""
        keys = " · ".join(f"{k} {v}" for k, v in self.keys.items())
        own = percent(max(self.dtype_share, 0.0))
        if self.share_interval is None:
            return (
                f"change {self.setting} first ({percent(self.share)} of the {self.dtype} "
                f"mismatch in this rollout, the dtype's own rounding {own})"
                + (f": {keys}" if keys else "")
            )
        shares = " and ".join(
            f"{name} {_share_with(share, low, high)}"
            for name, (share, low, high) in {
                self.setting: (self.share, *self.share_interval),
                **self.tied,
            }.items()
        )
        settings = " and ".join([self.setting, *self.tied])
        tied = ", not distinguishable from each other" if self.tied else ""
        if self.dtype_interval is not None:
            own = _share_with(self.dtype_share, *self.dtype_interval)
        return (
            f"change {settings} first (shares of the {self.dtype} mismatch in this "
            f"rollout: {shares}{tied}; the dtype's own rounding {own})"
            + (f": {keys}" if keys else "")
        )


@checked
@dataclass(frozen=True)
class Configured:
    """The rollout as configured (``probe --rollout``): its ``settings`` in words
    (``kv_cache_dtype=fp8_e4m3``) and each low-precision dtype's evidence under them, measured
    on the attribution's samples; the target length and batch are the decision's."""

    settings: str
    evidence: dict[str, Evidence] = field(default_factory=dict)
    target: int = 0
    batch: int = 0

    def clause(self, dtype: str) -> str:
        """``as configured (<settings>), <dtype> at <target> tokens keeps ... (<verdict>)``."""
        e = self.evidence[dtype]
        return (
            f"as configured ({self.settings}), {dtype} at {self.target:,} tokens keeps "
            f"{_kept(e)} of a batch of {self.batch:,} ({e.verdict})"
        )


@checked
@dataclass(frozen=True)
class Decision:
    """What to do: ``action`` (``train``, ``either``, ``undecided``, ``fix_setup``,
    ``fix_model``, ``nothing``), the ``dtype`` and ``keep_fp32_modules`` to train with, which
    evidence ``decided_by`` (``self-check``, ``overflow``, ``headroom``, ``attribution``,
    ``consequence``, ``mismatch``, ``none``), the attribution's ``change_first`` setting (empty
    without one or when it does not dominate), ``num_prompts`` that would decide an undecided
    comparison, and the one ``line`` the probe prints."""

    action: str
    dtype: str | None
    decided_by: str
    line: str
    keep_fp32_modules: tuple[str, ...] = ()
    num_prompts: int | None = None
    reasons: tuple[str, ...] = field(default_factory=tuple)
    change_first: str = ""
    #: The dtypes DeepSpeed's accelerator runs on the machine that measured (``{"float16":
    #: False, "bfloat16": True}``; empty: not known): the DeepSpeed form says when it refuses.
    deepspeed_runs: dict[str, bool] = field(default_factory=dict)

    @property
    def forms(self) -> dict[str, str]:
        """How to apply it: ``python``, ``deepspeed`` and ``env`` (empty without a dtype)."""
        if not self.dtype:
            return {}
        forms = apply_forms(self.dtype, self.keep_fp32_modules)
        if self.deepspeed_runs.get(self.dtype) is False:
            forms["deepspeed"] = _deepspeed_elsewhere(
                self.dtype, forms["deepspeed"], self.deepspeed_runs
            )
        return forms

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "action": self.action,
            "dtype": self.dtype,
            "keep_fp32_modules": list(self.keep_fp32_modules),
            "decided_by": self.decided_by,
            "num_prompts": self.num_prompts,
            "reasons": list(self.reasons),
            "change_first": self.change_first,
            "forms": self.forms,
            "line": self.line,
        }


@checked(dtype=dtype_name, keep_fp32_modules=policy_field("overflow.keep_fp32_modules"))
def apply_forms(dtype: str, keep_fp32_modules: Sequence[str] = ()) -> dict[str, str]:
    """The policy ``{"dtype": dtype, "overflow": {"keep_fp32_modules": [...]}}`` written for
    Python, the DeepSpeed config entry and the ``PRECISION_PLUGIN`` variable."""
    modules = list(keep_fp32_modules)
    entry: dict[str, Any] = {"dtype": dtype}
    if modules:
        entry["overflow"] = {"keep_fp32_modules": modules}
    args = [] if dtype == "float16" else [f"dtype={dtype!r}"]
    if modules:
        args.append(f"overflow={{'keep_fp32_modules': {modules!r}}}")
    env = dtype if not modules else json.dumps(entry, separators=(",", ":"))
    return {
        "python": f"precision_plugin.enable({', '.join(args)})",
        "deepspeed": f'"precision_plugin": {json.dumps(entry)}',
        "env": f"PRECISION_PLUGIN={env}" if not modules else f"PRECISION_PLUGIN='{env}'",
    }


def _deepspeed_elsewhere(dtype: str, form: str, runs: Mapping[str, bool]) -> str:
    """The DeepSpeed form where this machine's DeepSpeed accelerator refuses ``dtype`` (as
    ``doctor`` reports it): the form for a device that runs it, and what runs here."""
    short = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)
    here = [d for d in ("bfloat16", "float16") if d != dtype and runs.get(d)]
    instead = f'; here: "precision_plugin": {{"dtype": "{here[0]}"}} on both sides' if here else ""
    return (
        f"{form} on a device whose DeepSpeed runs {short} (this machine's DeepSpeed "
        f"accelerator has no {short}, as precision-plugin doctor says{instead})"
    )


def percent(value: Any) -> str:
    """A share as the probe's table and lines show it: ``0%``, ``<0.1%``, ``4.2%``, ``37%``,
    ``99.6%``, ``>99.9%``; ``n/a`` for a missing or non-finite value.

    Whole percents from 10 % up, except just below 1, where a whole percent would round 0.996
    up to ``100%`` and hide the part that is missing."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0%"
    if 0 < value < 0.001:
        return "<0.1%"
    if 0.999 < value < 1:
        return ">99.9%"
    return f"{value:.1%}" if abs(value) < 0.1 or 0.995 <= value < 1 else f"{value:.0%}"


def _share_with(share: float, low: float, high: float) -> str:
    """``62% [55%–70%]``: a share with its interval."""
    return f"{percent(share)} [{percent(low)}–{percent(high)}]"


def _kept(e: Evidence) -> str:
    value, low, high = e.kept.value, e.kept.low, e.kept.high
    return f"{percent(value)} ({percent(low)}–{percent(high)}, {e.sequences} sequences)"


@checked
def prompts_to_decide(
    a: tuple[float, float, float],
    b: tuple[float, float, float],
    n: Annotated[int, Whole(), at.Ge(1), at.Le(MAX_NUM_PROMPTS)],
) -> int | None:
    """About how many sequences make two overlapping intervals apart (their half-widths on the
    facing sides shrink as ``1/√n``); ``None`` when the central values are equal or the number
    is beyond ``MAX_NUM_PROMPTS``."""
    (va, la, ha), (vb, lb, hb) = a, b
    if not all(map(math.isfinite, (va, la, ha, vb, lb, hb))) or va == vb:
        return None
    upper, lower = (a, b) if va > vb else (b, a)
    gap = upper[0] - lower[0]
    reach = (upper[0] - upper[1]) + (lower[2] - lower[0])
    need = math.ceil(n * (reach / gap) ** 2 * 1.1)  # 10 %: the widths shrink a little slower
    return need if need <= MAX_NUM_PROMPTS else None


def _how(d: Decision) -> str:
    f = d.forms
    return f"apply: {f['python']} · DeepSpeed {f['deepspeed']} · {f['env']}"


def _compose(
    action: str,
    dtype: str | None,
    by: str,
    text: str,
    headroom: Headroom,
    reasons: list[str],
    num_prompts: int | None = None,
    chosen: Evidence | None = None,
    change: Attribution | None = None,
    configured: Configured | None = None,
    deepspeed_runs: Mapping[str, bool] | None = None,
) -> Decision:
    first = ""
    if change is not None and action not in ("fix_setup", "fix_model", "nothing"):
        text, by, first = _with_change(text, by, dtype, change, reasons, configured)
    if not first and configured is not None and dtype in configured.evidence:
        reasons.append(configured.clause(dtype))
    keep = headroom.modules if dtype == "float16" and headroom.action == "keep_fp32_modules" else ()
    if keep:
        reasons.append(
            f"headroom: {headroom.flagged} module(s) within {headroom.margin_bits:g} bits of "
            f"float16's maximum; keep where it starts in float32 on the learner"
        )
    if chosen is not None and chosen.verdict in ("costly", "severe"):
        reasons.append(
            f"{chosen.dtype} still loses more than half: generate shorter, or train with a "
            f"correction (verl's Seq-MIS, TRL's sequence_mask) and watch its masked share"
        )
    runs = dict(deepspeed_runs or {})
    d = Decision(action, dtype, by, "", tuple(keep), num_prompts, tuple(reasons), first, runs)
    line = text + ("; " + "; ".join(reasons) if reasons else "")
    if dtype:
        line += f". {_how(d)}"
    return dataclasses.replace(d, line=line + ".")


def _with_change(
    text: str,
    by: str,
    dtype: str | None,
    change: Attribution,
    reasons: list[str],
    configured: Configured | None = None,
) -> tuple[str, str, str]:
    """Fold the attribution into a dtype decision: (text, decided_by, change_first). With the
    rollout as configured measured, the line reads in order: what to change first, what the
    rollout keeps as configured now, then the dtype with the rollout at its defaults."""
    if not change.dominates:
        if change.cause == "dtype" and change.dtype == "bfloat16" and dtype == "float16":
            reasons.append(
                f"the attribution agrees: the compute dtype's rounding is "
                f"{percent(change.share)} of the bfloat16 mismatch"
            )
        return text, by, ""
    if by in ("overflow", "headroom"):  # a dtype that cannot run leads; the setting follows
        reasons.append("then " + change.clause())
        return text, by, change.setting
    now = ""
    if configured is not None and change.dtype in configured.evidence:
        now = f"; {configured.clause(change.dtype)}"
        text = f"then, with the rollout settings at their defaults, {text.removeprefix('do: ')}"
    else:
        text = f"then {text.removeprefix('do: ')}"
    return f"do: {change.clause()}{now}; {text}", "attribution", change.setting


@checked
def decide(
    evidence: Mapping[str, Evidence],
    *,
    target: int,
    batch: int,
    valid: bool = True,
    headroom: Headroom | None = None,
    refused: str | None = None,
    attribution: Attribution | None = None,
    configured: Configured | None = None,
    deepspeed_runs: Mapping[str, bool] | None = None,
) -> Decision:
    """The decision (see the module docstring). ``evidence``: the low-precision dtypes by name;
    ``target``/``batch``: the length and batch size the ``kept`` figures are for; ``valid``:
    the float32 self-check passed; ``refused``: why a rollout engine will not run float16;
    ``attribution``: the attribution's change-first (``probe --attribute``), when it ran;
    ``configured``: the rollout as configured (``probe --rollout``), said beside the dtype's
    figures, which are the default rollout's; ``deepspeed_runs``: the dtypes DeepSpeed's
    accelerator runs on this machine, for the DeepSpeed form of ``apply:``."""
    headroom = headroom or Headroom()

    def _finish(*args: Any, **kwargs: Any) -> Decision:
        return _compose(
            *args, change=attribution, configured=configured, deepspeed_runs=deepspeed_runs,
            **kwargs,
        )  # fmt: skip

    if not valid:
        return _finish(
            "fix_setup",
            None,
            "self-check",
            "do: fix the set-up first: the float32 self-check failed, so no dtype's figures are "
            "a precision measurement",
            headroom,
            [],
        )
    if headroom.action == "fix_model":
        return _finish(
            "fix_model",
            None,
            "overflow",
            f"do: fix the model first: {headroom.message}",
            headroom,
            [],
        )
    if not evidence:
        return _finish(
            "nothing",
            None,
            "none",
            "do: nothing to compare: no low-precision dtype was measured",
            headroom,
            [],
        )
    reasons: list[str] = []
    out: dict[str, str] = {}
    for e in evidence.values():
        if e.blocked:
            out[e.dtype] = e.blocked
    if "float16" in evidence and "float16" not in out:
        if refused:
            out["float16"] = refused
        elif headroom.action == "bfloat16":
            out["float16"] = f"headroom: {headroom.message}"
    runs = [e for e in evidence.values() if e.dtype not in out]
    at = f"at {target:,} tokens, a batch of {batch:,}"
    if not runs:
        why = "; ".join(f"{k}: {v}" for k, v in out.items())
        return _finish("nothing", None, "overflow", f"do: no dtype runs: {why}", headroom, [])
    if out:
        by = "headroom" if all(v.startswith("headroom") for v in out.values()) else "overflow"
        for name, why in out.items():
            reasons.append(f"{name} is out: {why}")
        if refused and "float16" in out and out["float16"] == refused:
            reasons.append(
                "float16 (precision_plugin.enable()) only with a rollout engine that runs it"
            )
        best = max(runs, key=lambda e: e.kept.value)
        return _finish(
            "train",
            best.dtype,
            by,
            f"do: train in {best.dtype}: {at} keeps {_kept(best)}",
            headroom,
            reasons,
            chosen=best,
        )
    if len(runs) == 1:
        (only,) = runs
        return _finish(
            "train",
            only.dtype,
            "consequence",
            f"do: train in {only.dtype}: {at} keeps {_kept(only)} (the only dtype measured)",
            headroom,
            reasons,
            chosen=only,
        )
    ranked = sorted(runs, key=lambda e: PREFERENCE.index(e.dtype) if e.dtype in PREFERENCE else 9)
    a, b = ranked[0], ranked[1]
    both = f"{a.dtype} {_kept(a)}, {b.dtype} {_kept(b)}"
    if min(a.kept.low, b.kept.low) >= 1.0 - NEGLIGIBLE:
        lower = min((a, b), key=lambda e: e.k3.value)
        other = b if lower is a else a
        text = f"do: either dtype works: {at} keeps {both} (every consequence under 1 %)"
        if _apart(lower.k3, other.k3):
            text += f"; {lower.dtype}'s k3 is {other.k3.value / lower.k3.value:.0f}x lower"
        return _finish("either", lower.dtype, "consequence", text, headroom, reasons)
    if _apart(a.kept, b.kept):
        best, worst = (a, b) if a.kept.low > b.kept.high else (b, a)
        text = f"do: train in {best.dtype}: {at} keeps {_kept(best)}, {worst.dtype} {_kept(worst)}"
        return _finish("train", best.dtype, "consequence", text, headroom, reasons, chosen=best)
    n = min(a.sequences, b.sequences)
    need = prompts_to_decide(_triple(a.kept), _triple(b.kept), n)
    more = (
        f"about --num-prompts {need:,} would decide it"
        if need
        else "no practical --num-prompts would: they are equal at this precision"
    )
    undecided = f"not enough sequences to decide on the consequence ({both}; {more})"
    if _apart(a.k3, b.k3):
        lower, other = (a, b) if a.k3.value < b.k3.value else (b, a)
        text = (
            f"do: train in {lower.dtype}: its mismatch is "
            f"{other.k3.value / lower.k3.value:.0f}x lower "
            f"(k3 {lower.k3.value:.1e} vs {other.k3.value:.1e}); {undecided}"
        )
        return _finish(
            "train", lower.dtype, "mismatch", text, headroom, reasons, need, chosen=lower
        )
    return _finish(
        "undecided",
        None,
        "none",
        f"do: {undecided}; their mismatch (k3) does not differ either",
        headroom,
        reasons,
        need,
    )


def _apart(a: Interval, b: Interval) -> bool:
    return a.low > b.high or b.low > a.high


def _triple(iv: Interval) -> tuple[float, float, float]:
    return (iv.value, iv.low, iv.high)
