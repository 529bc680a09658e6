"""AReaL (inclusionAI/AReaL): the overrides that make a run follow the policy, and a check of its
experiment config. Pure: works on AReaL's config objects (``GRPOConfig``/``PPOConfig`` from
``areal.api.cli_args``), an OmegaConf config or a plain dict, read by key or attribute.

How AReaL 1.0.4 spells the precision (``areal/api/cli_args.py``):

- ``sglang.dtype`` (default ``bfloat16``): ``SGLangConfig.build_args`` passes it as ``--dtype``
  to ``python -m areal.experimental.inference_service.sglang.launch_server``, which calls
  SGLang's ``prepare_server_args`` and ``Engine._launch_subprocesses`` without loading plugins
  first: the plugin's entry point verifies there, it cannot set, and only in the main process
  (AReaL's ``areal_run_scheduler_process`` does not call ``load_plugins``, and SGLang spawns its
  schedulers). AReaL 1.0.4 pins SGLang 0.5.10.post1, which has no plugin loader at all: there
  this config is the only place the dtype is set.
- ``actor.dtype`` / ``ref.dtype`` / ``critic.dtype`` (default ``bfloat16``): the learners'
  compute dtype. AReaL's FSDP engine has no loss scaler (no ``GradScaler`` in
  ``areal/engine/fsdp_engine.py``); its Megatron engine passes ``fp16=True`` to Megatron, which
  scales the loss itself.
- ``rollout.backend`` (``sglang:d4``; the deprecated ``allocation_mode`` ``sglang:d4+fsdp:d4``)
  says SGLang is the rollout engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import Invalid, Validator, checked
from precision_plugin._base.config_lookup import lookup
from precision_plugin._base.dtypes import dtype_label
from precision_plugin._base.report import Finding
from precision_plugin._core.manager import resolve_policy
from precision_plugin._core.serving import settle_findings
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.sglang.args import read_server_args
from precision_plugin.sglang.check import FRAMEWORK, launch_findings

#: AReaL's learner sections with a ``dtype`` and a ``backend``.
LEARNERS = ("actor", "ref", "critic")


@checked
def areal_overrides(policy: PrecisionPolicy | Mapping[str, Any] | str | None = None) -> list[str]:
    """The AReaL command-line overrides for ``policy``: ``++actor.dtype`` and ``++sglang.dtype``
    (Hydra's add-or-override: an experiment YAML need not spell the keys; add
    ``++ref.dtype=...``/``++critic.dtype=...`` when the experiment has them)."""
    pol = resolve_policy(policy, what="precision_plugin.areal.areal_overrides()")
    return [f"++actor.dtype={pol.dtype}", f"++sglang.dtype={pol.dtype}"]


def uses_sglang(cfg: Any) -> bool:
    """True when the experiment's rollout engine is SGLang."""
    backend = str(lookup(cfg, "rollout.backend", "") or "")
    mode = str(lookup(cfg, "allocation_mode", "") or "")
    return backend.startswith("sglang") or "sglang" in mode


def _areal_config(cfg: Any) -> Any:
    """The boundary check of an AReaL experiment config: one with a learner or rollout
    section (else the check would find nothing and say nothing)."""
    if cfg is None or isinstance(cfg, (str, bytes, os.PathLike, list, tuple)):
        raise Invalid(
            "is not an AReaL experiment config; pass the loaded config (the dataclass AReaL's "
            "load_expr_config returns, or a dict), not a path or a list"
        )
    if not any(lookup(cfg, key) is not None for key in (*LEARNERS, "rollout", "sglang")):
        raise Invalid(
            f"has none of the sections {', '.join((*LEARNERS, 'rollout', 'sglang'))}, so there "
            f"is nothing to check; pass the whole AReaL experiment config"
        )
    return cfg


@checked(cfg=Validator("an AReaL experiment config", _areal_config))
def check_areal_config(
    cfg: Any, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> list[Finding]:
    """Check an AReaL experiment config against ``policy``: each learner's ``dtype`` (and a
    float16 FSDP learner, which AReaL trains without a loss scaler), and, when the rollout
    backend is SGLang, the ``sglang`` section as the launch
    [`check_server_args`][precision_plugin.sglang.check_server_args] checks. ``error`` findings
    raise together under ``strictness="error"``; the findings are returned."""
    from precision_plugin._core.configs import AREAL

    pol = resolve_policy(policy)
    AREAL.read_mapping(cfg, "the AReaL config")  # typos of known keys, values OmegaConf refuses
    findings: list[Finding] = []
    for role in LEARNERS:
        section = lookup(cfg, role)
        if section is None:
            continue
        raw = str(lookup(section, "dtype", "bfloat16"))
        runs = dtype_label(raw)  # 'half', 'BF16', 'fp16': one vocabulary
        if runs != pol.dtype:
            findings.append(
                Finding(
                    FRAMEWORK,
                    "error",
                    f"AReaL's {role} trains in {runs} ({role}.dtype) while the policy is "
                    f"{pol.dtype}.",
                    fix=f"{role}.dtype={pol.dtype}",
                )
            )
        backend = str(lookup(section, "backend", "") or "")
        if runs == "float16" and pol.uses_loss_scaler and backend.startswith("fsdp"):
            findings.append(
                Finding(
                    FRAMEWORK,
                    "warning",
                    f"AReaL's {role} trains float16 on its FSDP engine, which has no loss scaler "
                    f"(AReaL 1.0.4): small gradients underflow to zero.",
                    fix=f"use the Megatron backend ({role}.backend=megatron:...) for float16, "
                    f"or the consistent-bf16 mode",
                )
            )
    if uses_sglang(cfg):
        section = lookup(cfg, "sglang")
        values = read_server_args(section if section is not None else {})
        values["model_path"] = values.get("model_path") or lookup(cfg, "actor.path")
        findings.extend(launch_findings(values, pol, {}, where="each of AReaL's SGLang servers"))
    return settle_findings(findings, pol)
