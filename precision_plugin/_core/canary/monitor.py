"""The drift canary: fixed tokens rescored by both sides every K steps, and what a rise means.

The canary is a fixed set of (prompt, completion) token sequences taken once (the first rollout
batch, or the probe's samples). Every K steps the rollout engine scores it through its own
scoring path and the learner scores it at its current weights; both are per-token log-probs of
the *same* tokens, so their k3 measures the two engines alone, with no sampling noise and no
policy movement in it. [`CanaryMonitor`][precision_plugin._core.canary.CanaryMonitor] keeps each
check's log-probs of both sides and decides, from them alone:

- the band: the first check is the floor; [`canary_band`][precision_plugin._core.canary.canary_band]
  says how far rounding alone moves a later check;
- an alarm: out of band on two consecutive checks (warned once; ``strictness="error"`` raises
  [`CanaryAlarmError`][precision_plugin.errors.CanaryAlarmError]);
- its verdict: ``weights_out_of_sync`` when the rollout's canary log-probs are those of an earlier
  check while the learner's moved (its weights were not refreshed: "stale since step s"),
  ``engine_state_drift`` when the canary grows and neither side's log-probs are an earlier
  check's (at learning rate 0: the learner stands still and the rollout moves anyway);
- ``policy_moving`` (no alarm, said once): the canary holds its band while the per-batch
  mismatch grows past the same relative width: the policy moves into regions where the engines
  disagree more, the engines themselves did not change.

Pure logic over lists of floats: no framework, no tensor; the TRL wiring is
``precision_plugin.trl.canary``.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from precision_plugin._base.boundary import checked, policy_field
from precision_plugin._core.canary.band import (
    ABS_TOL,
    ABS_TOL_RANGE,
    ALPHA,
    ALPHA_RANGE,
    CanaryBand,
    _count,
    canary_band,
    layout_difference,
    token_k3,
)
from precision_plugin._core.scoring.bitwise import bitwise_equal
from precision_plugin.errors import CanaryAlarmError, PrecisionConfigError

log = logging.getLogger("precision_plugin")

#: Numeric code of each verdict as logged in ``precision/canary_verdict`` (0: none).
VERDICT_CODES: dict[str | None, int] = {
    None: 0,
    "weights_out_of_sync": 1,
    "engine_state_drift": 2,
    "policy_moving": 3,
    "weight_sync_fault": 4,  # the post-sync check (precision_plugin._core.canary.sync_check)
}


def _position(rows: Sequence[Sequence[float]], flat: int) -> str:
    """``(row i, token j)`` of the ``flat``-th token of ``rows``."""
    for i, row in enumerate(rows):
        if flat < len(row):
            return f"(row {i}, token {flat})"
        flat -= len(row)
    return f"(token {flat})"


def _bits(rows: Sequence[Sequence[float]]) -> bytes:
    return b"".join(struct.pack(f"<{len(r)}d", *r) for r in rows)


@checked
@dataclass(frozen=True)
class CanaryCheck:
    """One check: its ``step``, the canary's ``k3`` and bit-equal share, its ratio to the floor,
    whether it is ``in_band``, and what the monitor concluded (``verdict``, ``alarm`` on the
    check that raised it, ``stale_since``, ``reason`` in words)."""

    step: int
    k3: float
    bitwise_equal_frac: float
    ratio: float
    in_band: bool
    verdict: str | None = None
    alarm: bool = False
    stale_since: int | None = None
    reason: str = ""
    batch_k3: float | None = None
    reference_k3: float | None = None

    def metrics(self) -> dict[str, float]:
        """The check as ``precision/*`` metric values (names without the prefix)."""
        extra = {} if self.reference_k3 is None else {"canary_reference_k3": self.reference_k3}
        return {
            **extra,
            "canary_k3": self.k3,
            "canary_bitwise_equal_frac": self.bitwise_equal_frac,
            "canary_ratio": self.ratio,
            "canary_in_band": float(self.in_band),
            "canary_verdict": float(VERDICT_CODES[self.verdict]),
        }


@dataclass
class _Kept:
    step: int
    learner: bytes
    rollout: bytes
    learner_logps: list[list[float]]
    in_band: bool


@checked(
    strictness=policy_field("strictness"),
    alpha=ALPHA_RANGE,
    abs_tol=ABS_TOL_RANGE,
)
@dataclass
class CanaryMonitor:
    """The canary's state over a run: the floor band, every check's log-probs, the verdicts.

    Feed it [`check`][precision_plugin._core.canary.CanaryMonitor.check] with both sides' log-probs
    of
    the same canary tokens; the first call sets the floor. ``strictness="error"`` raises
    [`CanaryAlarmError`][precision_plugin.errors.CanaryAlarmError] at the alarm.
    """

    strictness: str = "warn"
    alpha: float = ALPHA
    abs_tol: float = ABS_TOL
    band: CanaryBand | None = None
    checks: list[CanaryCheck] = field(default_factory=list)
    _kept: list[_Kept] = field(default_factory=list)
    _alarmed: bool = False
    _noted_policy: bool = False
    _first_batch_k3: float | None = None
    _batch_out: int = 0
    _reference: float | None = None
    _layout: list[int] | None = None
    _with_reference: bool | None = None

    @property
    def alarm(self) -> CanaryCheck | None:
        """The check that raised the alarm, or ``None``."""
        return next((c for c in self.checks if c.alarm), None)

    def check(
        self,
        step: int,
        learner: Sequence[Sequence[float]],
        rollout: Sequence[Sequence[float]],
        *,
        batch_k3: float | None = None,
        reference: Sequence[Sequence[float]] | None = None,
    ) -> CanaryCheck:
        """Record one check at ``step``: ``learner``/``rollout`` per-token log-probs of the
        canary (one list per sequence, the same tokens on both sides); ``batch_k3``: the
        per-batch k3 logged for this step, if any (for the ``policy_moving`` note);
        ``reference``: the learner's log-probs of the canary in float32 (the precision
        reference: the band then holds ``k3 / k3(learner, reference)``, see
        [`canary_band`][precision_plugin._core.canary.canary_band])."""
        self._refuse_inputs(step, learner, rollout, reference)
        per_token = token_k3(learner, rollout)
        k3 = math.fsum(per_token) / len(per_token)  # _refuse_inputs: at least one token
        equal = bitwise_equal(learner, rollout).fraction
        ref_tokens = token_k3(learner, reference) if reference is not None else None
        ref = math.fsum(ref_tokens) / len(ref_tokens) if ref_tokens else None
        if self.band is None:
            for tokens, side in ((per_token, "rollout"), (ref_tokens or [], "reference")):
                if math.inf in tokens:
                    at = _position(learner, tokens.index(math.inf))
                    raise PrecisionConfigError(
                        f"CanaryMonitor.check(step={step}): at the floor check the learner's "
                        f"and the {side}'s log-probs at {at} differ by more than 709 nats "
                        f"(k3 overflows float64), which would leave the band infinite; score "
                        f"the same canary tokens on both sides with the same model."
                    )
            self.band = canary_band(
                per_token, reference_k3=ref_tokens, alpha=self.alpha, abs_tol=self.abs_tol
            )
            self._layout = [len(r) for r in learner]
            self._with_reference = reference is not None
            if self.band.note:
                log.warning("precision_plugin: canary floor at step %d: %s.", step, self.band.note)
        band = self.band
        self._reference = ref
        value = band.statistic(per_token, ref)
        in_band = band.contains(value)
        kept = _Kept(step, _bits(learner), _bits(rollout), [list(r) for r in learner], in_band)
        verdict, stale, reason = None, None, ""
        previous = self.checks[-1] if self.checks else None
        alarm = not in_band and previous is not None and not previous.in_band
        if alarm:
            verdict, stale, reason = self._classify(kept, rollout)
        elif in_band:
            verdict, reason = self._policy_note(step, batch_k3)
        self._kept.append(kept)
        result = CanaryCheck(
            step, k3, equal, band.ratio(value), in_band, verdict, alarm and not self._alarmed,
            stale, reason, batch_k3, ref,
        )  # fmt: skip
        self.checks.append(result)
        if alarm and not self._alarmed:
            self._alarmed = True
            self._raise_alarm(result)
        return result

    def _refuse_inputs(
        self,
        step: int,
        learner: Sequence[Sequence[float]],
        rollout: Sequence[Sequence[float]],
        reference: Sequence[Sequence[float]] | None,
    ) -> None:
        """Refuse a check that cannot be compared with the floor (before anything is kept)."""
        where = f"CanaryMonitor.check(step={step})"
        if step < 0:
            raise PrecisionConfigError(
                f"{where}: the step is negative; pass the optimizer step of the check (>= 0)."
            )
        if self._kept and step <= self._kept[-1].step:
            raise PrecisionConfigError(
                f"{where}: the previous check was at step {self._kept[-1].step}; check at most "
                f"once per step, at increasing steps."
            )
        differ = layout_difference(learner, rollout)
        if differ is not None:
            raise PrecisionConfigError(
                f"{where}: the learner's and the rollout's log-probs cover different tokens "
                f"({differ}); score the same canary sequences on both sides."
            )
        if reference is not None:
            differ = layout_difference(learner, reference)
            if differ is not None:
                raise PrecisionConfigError(
                    f"{where}: the learner's and the reference's log-probs cover different "
                    f"tokens ({differ}); score the same canary sequences in float32 as the "
                    f"reference."
                )
        tokens = sum(map(len, learner))
        if tokens == 0:
            raise PrecisionConfigError(
                f"{where}: the canary has no token ({_count(len(learner), 'sequence')}"
                f"{', all empty' if learner else ''}); pass "
                f"both sides' log-probs of at least one canary token."
            )
        for side, rows in (("learner", learner), ("rollout", rollout), ("reference", reference)):
            for i, row in enumerate(rows or ()):
                for j, value in enumerate(row):
                    if not math.isfinite(float(value)):
                        raise PrecisionConfigError(
                            f"{where}: the {side}'s log-prob at (row {i}, token {j}) is "
                            f"{float(value)}; pass finite log-probs of every canary token."
                        )
        # A band of ratios needs the reference at every check; a band of the raw k3 that the
        # floor gave no reference cannot use one later. (A floor's reference of no use, so a
        # raw band, makes the reference optional: the band holds the raw k3 either way.)
        normalized = self.band is not None and self.band.normalized
        if (normalized and reference is None) or (
            self._with_reference is False and reference is not None
        ):
            first = self._kept[0].step if self._kept else 0
            had, now = ("with", "without") if normalized else ("without", "with")
            held = "k3 over the reference's" if normalized else "raw k3"
            raise PrecisionConfigError(
                f"{where}: the floor check (step {first}) came {had} a float32 reference and "
                f"this one comes {now}, so its k3 cannot be compared with the band (it holds the "
                f"{held}); pass reference= at every check, or at none."
            )
        layout = [len(r) for r in learner]
        if self._layout is not None and layout != self._layout:
            first = self._kept[0].step if self._kept else 0
            had = f"{_count(sum(self._layout), 'token')} ({_count(len(self._layout), 'sequence')})"
            now = (
                _count(tokens, "token")
                if tokens != sum(self._layout)
                else f"the same {_count(tokens, 'token')} in sequences of {layout} tokens"
            )
            raise PrecisionConfigError(
                f"{where}: the canary had {had} at step {first} and {now} now; rescore the same "
                f"canary set at every check."
            )

    def _classify(
        self, now: _Kept, rollout: Sequence[Sequence[float]]
    ) -> tuple[str, int | None, str]:
        """The verdict of an out-of-band check that follows another one."""
        band = self.band
        assert band is not None
        earlier = self._kept
        learner_moved = bool(earlier) and earlier[-1].learner != now.learner
        # The rollout holds the weights of an earlier learner check: it was not refreshed.
        for old in reversed(earlier):
            if old.learner == now.learner:
                continue  # the learner has not moved since: no evidence either way
            k3 = token_k3(old.learner_logps, rollout)
            if k3 and band.contains(band.statistic(k3, self._reference)):
                return (
                    "weights_out_of_sync",
                    old.step,
                    f"the rollout's canary log-probs match the learner's of step {old.step} "
                    f"(within the floor's band) while the learner has moved since",
                )
        # The rollout's log-probs have not changed since an earlier check; the learner's have.
        same = [old for old in earlier if old.rollout == now.rollout]
        if same and learner_moved:
            since = same[0].step
            return (
                "weights_out_of_sync",
                since,
                f"the rollout's canary log-probs are bit-identical to those of step {since} "
                f"while the learner's moved: its weights have not been refreshed since",
            )
        if earlier and not learner_moved:
            still = next(o.step for o in earlier if o.learner == now.learner)
            return (
                "engine_state_drift",
                None,
                f"the learner's canary log-probs have not changed since step {still} (its "
                f"weights stand still, e.g. learning rate 0) while the rollout's moved away",
            )
        return (
            "engine_state_drift",
            None,
            "the canary grew while neither side's log-probs match an earlier check",
        )

    def _policy_note(self, step: int, batch_k3: float | None) -> tuple[str | None, str]:
        """``policy_moving`` when the batch mismatch left the band's relative width twice in a
        row while the canary stayed in band (said once)."""
        band = self.band
        if batch_k3 is None or band is None or not math.isfinite(batch_k3):
            return None, ""
        if self._first_batch_k3 is None:
            self._first_batch_k3 = batch_k3
            return None, ""
        width = band.upper / band.floor if band.floor > 0 else math.inf
        grew = self._first_batch_k3 > 0 and batch_k3 / self._first_batch_k3 > width
        self._batch_out = self._batch_out + 1 if grew else 0
        if self._batch_out < 2:
            return None, ""
        reason = (
            f"the per-batch k3 grew {batch_k3 / self._first_batch_k3:.3g}x since the first "
            f"check while the canary stayed within its band: the policy is moving into tokens "
            f"the engines disagree on more; the engines themselves have not changed"
        )
        if not self._noted_policy:  # said once, where a default log shows it (no alarm)
            self._noted_policy = True
            log.warning(
                "precision_plugin: canary at step %d: policy_moving (no alarm): %s.", step, reason
            )
        return "policy_moving", reason

    def _raise_alarm(self, check: CanaryCheck) -> None:
        band = self.band
        assert band is not None
        stale = f" (stale since step {check.stale_since})" if check.stale_since is not None else ""
        message = (
            f"the drift canary left its band on two consecutive checks (step {check.step}: k3 "
            f"{check.k3:.3g}, {check.ratio:.3g}x the floor; band up to "
            f"{band.upper / band.floor if band.floor > 0 else math.inf:.3g}x): "
            f"{check.verdict}{stale}: {check.reason}"
        )
        fix = {
            "weights_out_of_sync": (
                "check the weight sync to the rollout engine (a failed or skipped update, a "
                "wrong parameter-name mapping, a sync interval)"
            ),
            "engine_state_drift": (
                "restart or reset the rollout engine's state (KV/prefix cache after a weight "
                "update, CUDA graphs); compare with precision-plugin probe"
            ),
        }[check.verdict or "engine_state_drift"]
        if self.strictness == "error":
            raise CanaryAlarmError(
                f"precision_plugin: {message} (strictness='error'). Fix: {fix}.",
                verdict=check.verdict or "engine_state_drift",
                step=check.step,
                stale_since=check.stale_since,
            )
        log.warning("precision_plugin: %s. Fix: %s.", message, fix)
