"""The policy's ``batch_invariant`` setting: what the installed rollout engines can enable.

- vLLM: ``VLLM_BATCH_INVARIANT=1`` from 0.11.1, read at engine start in every engine process
  (engine-core subprocesses inherit this process's environment; verl and OpenRLHF must carry it
  into Ray's ``runtime_env``). It needs an invariant attention backend (FLASH_ATTN, FLASHINFER,
  FLASH_ATTN_MLA, TRITON_MLA, newer TRITON_ATTN) and a GPU its version supports (compute
  capability >= 8.0 or >= 9.0 depending on the version's docs), which a CPU learner under Ray
  cannot see. Reported cost: 1.3-2.4x (Thinking Machines ~1.6x, the vLLM bitwise RL run 2.4x).
- SGLang: ``--enable-deterministic-inference``, a server flag (FlashInfer, FA3 or Triton
  attention); reported cost ~34% with CUDA graphs. The plugin cannot set a server's flags; it
  says what to pass.

``off`` reports nothing, ``auto`` reports what could be enabled and its cost, ``on`` enables
what it can (``apply``) and reports what it could not and why. Level 2 is only claimed when the
canary's check certifies it (``precision_plugin._core.canary.ladder``).
"""

from __future__ import annotations

from precision_plugin._base.boundary import checked, version_text
from precision_plugin._base.patching import Patcher
from precision_plugin._base.report import Finding
from precision_plugin.policy import PrecisionPolicy

#: First vLLM with ``VLLM_BATCH_INVARIANT``.
VLLM_MIN = "0.11.1"
ENV = "VLLM_BATCH_INVARIANT"
VLLM_COST = "reported cost 1.3-2.4x (Thinking Machines ~1.6x, the vLLM bitwise RL run 2.4x)"
SGLANG_COST = "reported cost ~34% with CUDA graphs (lmsys)"
NEEDS = (
    "it needs an invariant attention backend (FLASH_ATTN, FLASHINFER, TRITON_MLA, ...) and a GPU "
    "of compute capability >= 8.0 (>= 9.0 in some versions), which a CPU learner under Ray "
    "cannot see; the canary's level-2 check certifies it"
)


@checked
def batch_invariant_findings(
    policy: PrecisionPolicy, vllm: str | None, sglang: str | None
) -> list[Finding]:
    """What ``policy.batch_invariant`` means with these installed versions (``None``: absent)."""
    from packaging.version import Version

    mode = policy.batch_invariant
    if mode == "off":
        return []
    found: list[Finding] = []
    if vllm is not None:
        if Version(vllm) >= Version(VLLM_MIN):
            status = "change" if mode == "on" else "info"
            verb = "enable() sets" if mode == "on" else "batch_invariant='on' would set"
            found.append(
                Finding("vllm", status, f"vLLM {vllm}: {verb} {ENV}=1 ({VLLM_COST}); {NEEDS}")
            )
        else:
            found.append(
                Finding(
                    "vllm",
                    "warning" if mode == "on" else "info",
                    f"vLLM {vllm} has no batch-invariant mode ({ENV} arrived in {VLLM_MIN}); "
                    f"nothing enabled",
                    fix=f"upgrade vLLM to >= {VLLM_MIN} for batch_invariant='on'",
                )
            )
    if sglang is not None:
        found.append(
            Finding(
                "sglang",
                "warning" if mode == "on" else "info",
                f"SGLang {sglang}: deterministic inference is a server flag the plugin cannot set "
                f"({SGLANG_COST})",
                fix="start the server with --enable-deterministic-inference and "
                "--attention-backend flashinfer (or fa3, triton)",
            )
        )
    if vllm is None and sglang is None and mode == "on":
        found.append(
            Finding(
                "rollout",
                "warning",
                "batch_invariant='on': no vLLM or SGLang installed; an HF rollout engine is "
                "batch-invariant only at batch size 1 (HFRollout(max_batch=1))",
            )
        )
    return found


@checked
def apply_batch_invariant(policy: PrecisionPolicy, patcher: Patcher, vllm: str | None) -> bool:
    """With ``batch_invariant='on'`` and a vLLM that has the mode: set ``VLLM_BATCH_INVARIANT=1``
    in this process (before any engine starts; ``disable()`` restores it). Returns whether it
    was set."""
    from packaging.version import Version

    if policy.batch_invariant != "on" or vllm is None or Version(vllm) < Version(VLLM_MIN):
        return False
    patcher.setenv(ENV, "1", reason="policy batch_invariant='on' (vLLM reads it at engine start)")
    return True


@checked(vllm=version_text("vLLM", "0.11.1"))
def batch_invariant_env(policy: PrecisionPolicy, vllm: str | None) -> dict[str, str]:
    """``{"VLLM_BATCH_INVARIANT": "1"}`` for the environment of engine processes started
    elsewhere (verl's and OpenRLHF's Ray actors, through ``runtime_env``'s ``env_vars``) with
    ``batch_invariant='on'``, unless the vLLM seen here (``None``: not installed here, as on a
    driver without vLLM) is older than 0.11.1 and has no such mode."""
    from packaging.version import Version

    if policy.batch_invariant != "on":
        return {}
    if vllm is not None and Version(vllm) < Version(VLLM_MIN):
        return {}
    return {ENV: "1"}
