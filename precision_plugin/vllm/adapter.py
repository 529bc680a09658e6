"""The vLLM adapter's hooks: install the enforcement, verify TRL's engine or server, doctor
findings, and the probe engine. vLLM is imported lazily; without it every hook does nothing."""

from __future__ import annotations

import os
import sys
from typing import Any

from precision_plugin._base.patching import Patcher
from precision_plugin._base.report import Finding
from precision_plugin.hookspecs import hookimpl
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm.enforce import install_vllm_patches, patch_lock
from precision_plugin.vllm.engine import vllm_version
from precision_plugin.vllm.server import verify_engine, verify_server


@hookimpl
def precision_install(policy: PrecisionPolicy, patcher: Patcher) -> None:
    """Make colocated engines (TRL's ``LLM(...)`` passes no dtype) and child processes follow
    ``policy``: patch now if vLLM is already imported, else when vLLM loads its plugins."""
    if vllm_version() is None:
        return
    from precision_plugin._core.batch_invariance import apply_batch_invariant

    info = vllm_version()
    apply_batch_invariant(policy, patcher, str(info.version) if info else None)  # before engines
    from precision_plugin.vllm.invariance import check_attention_backend

    check_attention_backend(policy, environ=os.environ)  # strict: refused at enable()
    with patch_lock:
        if any(name == "vllm" or name.startswith("vllm.") for name in list(sys.modules)):
            install_vllm_patches(policy, patcher)
            return
    # Not through the general plugin alone: vLLM loads general plugins once per process and
    # only those VLLM_PLUGINS allows, but enable() here must reach this process's engines.
    patcher.when_imported(
        "vllm.engine.arg_utils",
        lambda module: install_vllm_patches(policy, patcher, runner=False),
        reason="enable() imports no framework",
    )


@hookimpl
def precision_train_begin(policy: PrecisionPolicy, args: Any, trainer: Any) -> None:
    """Verify the vLLM a TRL trainer uses: the server (server mode) or the colocated engine."""
    if not getattr(args, "use_vllm", False) or trainer is None:
        return
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None:
        return
    mode = getattr(args, "vllm_mode", None) or getattr(generation, "mode", None)
    if mode == "server":
        client = getattr(generation, "vllm_client", None)
        if policy.vllm.verify_server and client is not None:  # the client lives on rank 0 only
            verify_server(client, policy)
    elif getattr(generation, "llm", None) is not None:
        verify_engine(generation.llm, policy)


@hookimpl
def precision_doctor(policy: PrecisionPolicy) -> list[Finding]:
    """What vLLM is installed, whether TRL supports it, the cascade verdict, what enable()
    changes."""
    from precision_plugin._base.versions import installed_version
    from precision_plugin._core.batch_invariance import batch_invariant_findings
    from precision_plugin.vllm.doctor import doctor_findings
    from precision_plugin.vllm.invariance import (
        attention_backend_findings,
        invariant_backends,
        selected_backend,
    )

    info, sglang = vllm_version(), installed_version("sglang")
    invariance = batch_invariant_findings(
        policy, str(info.version) if info else None, str(sglang) if sglang else None
    )
    backend = selected_backend(environ=os.environ)
    if policy.batch_invariant == "on" and backend is not None:  # a finding, never raised here
        lenient = policy.replace(strictness="warn")
        invariance += attention_backend_findings(lenient, backend, invariant_backends())
    return [*doctor_findings(policy), *invariance]


@hookimpl
def precision_probe_engines() -> dict[str, Any]:
    """``{"vllm": factory}``: vLLM as the probe's rollout engine (CUDA, or CPU with a CPU
    build of vLLM)."""
    from precision_plugin.vllm.probe_engine import VLLMRolloutEngine

    return {"vllm": VLLMRolloutEngine}
