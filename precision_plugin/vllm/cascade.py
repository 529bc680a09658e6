"""What each vLLM version does with cascade attention, and what the guard should do about it.

Pure: no vLLM import. The table (research-vllm.md §2, read from the released wheels):

=============  ==================================================================================
vLLM           cascade attention
=============  ==================================================================================
< 0.7.0        no V1 engine, no cascade attention
0.7.0 - 0.8.1  V1 cascade attention, no flag to turn it off
0.8.2 - 0.10.x ``disable_cascade_attn`` flag, default off; FA2 kv-split LSE bug on non-Hopper GPUs
               (vllm-project/flash-attention#87, vllm#22103)
0.11 - 0.17.x  flag, default off; the FA2 bug is fixed (FA bump vllm#25537)
0.18 - 0.31.x  flag, default **on** (cascade disabled; vllm#36318)
>= 0.32.0      cascade attention removed; the flag is a deprecated no-op that only warns
=============  ==================================================================================

Pre-releases and dev builds compare as ``packaging`` orders them (``0.11.0rc1 < 0.11.0``), so a
build from before a release is treated as the version before it: the safe side for every
boundary above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.version import Version

from precision_plugin._base.boundary import checked, gpu_capability, version_text

CascadeMode = Literal["auto", "force", "off"]
Action = Literal["pass_flag", "patch_runner", "leave", "drop_flag"]
Era = Literal["missing", "no_cascade", "no_flag", "buggy", "fixed", "default_disabled", "removed"]

FLAG = "disable_cascade_attn"

V1_ENGINE = Version("0.7.0")
FLAG_ADDED = Version("0.8.2")
FA2_FIXED = Version("0.11.0")
DEFAULT_DISABLED = Version("0.18.0")
REMOVED = Version("0.32.0")

#: Compute-capability major versions whose vLLM attention is FA3 (Hopper): not affected.
_FA3_MAJORS = (9,)


@checked
@dataclass(frozen=True)
class CascadeDecision:
    """What the guard does for one vLLM version, GPU and ``cascade_guard`` mode, and why.

    ``action``: ``pass_flag`` (pass ``disable_cascade_attn=True``), ``patch_runner`` (no flag
    exists: make the prefix-length computation return 0 inside the engine), ``leave`` (do
    nothing), ``drop_flag`` (the flag is gone or deprecated: never pass it, remove a user's).
    """

    action: Action
    era: Era
    reason: str
    version: str | None = None
    capability: tuple[int, int] | None = None
    mode: CascadeMode = "auto"

    @property
    def disables(self) -> bool:
        """True when the plugin itself turns cascade attention off."""
        return self.action in ("pass_flag", "patch_runner")

    @property
    def flag_allowed(self) -> bool:
        """True when passing ``disable_cascade_attn`` is meaningful for this vLLM."""
        return self.era in ("buggy", "fixed", "default_disabled")

    def summary(self) -> str:
        """One line for logs and ``doctor``."""
        where = f"vLLM {self.version}" if self.version else "no vLLM"
        gpu = f", GPU cc {self.capability[0]}.{self.capability[1]}" if self.capability else ""
        return f"cascade-attention guard ({self.mode}, {where}{gpu}): {self.action}. {self.reason}"


@checked(version=version_text("vLLM"))
def cascade_era(version: Version | str | None) -> Era:
    """Classify a vLLM version by what it does with cascade attention."""
    if version is None:
        return "missing"
    v = version if isinstance(version, Version) else Version(str(version))
    if v < V1_ENGINE:
        return "no_cascade"
    if v < FLAG_ADDED:
        return "no_flag"
    if v < FA2_FIXED:
        return "buggy"
    if v < DEFAULT_DISABLED:
        return "fixed"
    if v < REMOVED:
        return "default_disabled"
    return "removed"


def _gpu_affected(capability: tuple[int, int] | None) -> tuple[bool, str]:
    if capability is None:
        return True, (
            "no GPU is visible here, so it is disabled to be safe (it only costs speed on "
            "shared-prefix batches)"
        )
    if capability[0] in _FA3_MAJORS:
        return False, (
            f"compute capability {capability[0]}.{capability[1]} (Hopper) runs FA3, which "
            f"vllm#22103 found unaffected"
        )
    return True, (
        f"compute capability {capability[0]}.{capability[1]} runs FA2, whose kv-split LSE bug "
        f"(vllm-project/flash-attention#87, vllm#22103) inflates the train/rollout mismatch"
    )


@checked(version=version_text("vLLM"), capability=gpu_capability)
def cascade_decision(
    version: Version | str | None,
    capability: tuple[int, int] | None = None,
    mode: CascadeMode = "auto",
) -> CascadeDecision:
    """Decide what the cascade-attention guard does for ``version``, a GPU and a policy mode.

    ``capability`` is the CUDA compute capability of the rollout GPU, ``None`` when unknown.
    """
    v = None if version is None else Version(str(version))  # parsed by the boundary
    era = cascade_era(v)
    shown = str(v) if v is not None else None

    def decide(action: Action, reason: str) -> CascadeDecision:
        return CascadeDecision(action, era, reason, shown, capability, mode)

    if era == "missing":
        return decide("leave", "vLLM is not installed.")
    if mode == "off":
        return decide("leave", "cascade_guard='off': vLLM is left as configured.")
    if era == "no_cascade":
        return decide("leave", "vLLM before 0.7 has no V1 engine and no cascade attention.")
    if era == "removed":
        return decide(
            "drop_flag",
            "vLLM 0.32 removed cascade attention; disable_cascade_attn is a deprecated no-op "
            "that only warns and will raise once dropped, so it is never passed.",
        )
    if era == "no_flag":
        if mode == "force":
            return decide(
                "patch_runner",
                "cascade_guard='force' and this vLLM has no disable_cascade_attn flag (added "
                "in 0.8.2): the engine's cascade prefix length is forced to 0.",
            )
        affected, why = _gpu_affected(capability)
        if not affected:
            return decide("leave", f"No flag before 0.8.2, and {why}.")
        return decide(
            "patch_runner",
            f"No disable_cascade_attn flag before 0.8.2 and {why}: the engine's cascade prefix "
            f"length is forced to 0 (or upgrade vLLM to >= 0.11).",
        )
    if mode == "force":
        return decide("pass_flag", "cascade_guard='force': disable_cascade_attn=True is passed.")
    if era == "buggy":
        affected, why = _gpu_affected(capability)
        if affected:
            return decide("pass_flag", f"vLLM < 0.11 and {why}.")
        return decide("leave", f"vLLM < 0.11, but {why}.")
    if era == "fixed":
        return decide(
            "leave",
            "vLLM >= 0.11 ships the fixed FlashAttention (vllm#25537); cascade attention is "
            "left on (cascade_guard='force' disables it anyway).",
        )
    return decide(
        "leave",
        "vLLM >= 0.18 disables cascade attention by default (vllm#36318); nothing to pass.",
    )
