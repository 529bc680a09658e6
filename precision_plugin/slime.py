"""slime (THUDM/slime): the flags that make a run follow the policy, and a check of its command
line. Pure: slime is not on PyPI (the ``slime`` distribution there is an unrelated package) and
imports Megatron, so its command line is read here the way slime reads it.

How slime spells the precision (read at THUDM/slime ``624b824a``):

- ``--fp16`` (Megatron's flag): Megatron trains in float16 (slime sets ``args.bf16 = not
  args.fp16``, ``backends/megatron_utils/arguments.py``) and every SGLang engine gets
  ``dtype="float16"`` (``backends/sglang_utils/sglang_engine.py`` ``_compute_server_args``,
  slime#708). Without it Megatron trains in bfloat16.
- ``--sglang-<flag>``: every SGLang ``ServerArgs`` flag with the ``--sglang-`` prefix, e.g.
  ``--sglang-dtype``; ignored for the dtype when ``--fp16`` already set it.
- ``--sglang-config FILE``: a YAML with per-model server groups whose ``overrides`` (SGLang field
  names) are applied last and win over both.
- SGLang itself starts through ``http_server.launch_server`` in a spawned child, which resolves
  the arguments before plugins load: the plugin's entry point verifies there, it cannot set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.report import Finding
from precision_plugin._core.manager import resolve_policy
from precision_plugin._core.serving import settle_findings
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.sglang.args import FIELDS, field_parser, read_yaml
from precision_plugin.sglang.check import FRAMEWORK, launch_findings

#: ``ServerArgs`` fields slime does not re-export as ``--sglang-*`` (it sets them itself).
SKIPPED = ("model_path",)
_NO_ENGINE = ("placeholder",)


@checked
def slime_args(policy: PrecisionPolicy | Mapping[str, Any] | str | None = None) -> list[str]:
    """The slime flags for ``policy``: ``--fp16`` (Megatron and every SGLang engine in float16)
    or ``--sglang-dtype bfloat16`` (slime's learner default is bf16).

    slime's Megatron learner runs float16 or bfloat16 only: a float32 policy is refused.
    """
    return _flags(resolve_policy(policy, what="precision_plugin.slime.slime_args()"))


def _flags(pol: PrecisionPolicy) -> list[str]:
    """``slime_args`` for a resolved policy."""
    if pol.dtype == "float16":
        return ["--fp16"]
    if pol.dtype == "bfloat16":
        return ["--sglang-dtype", "bfloat16"]
    raise PrecisionConfigError(
        "slime was asked to run float32; its Megatron learner trains in float16 (--fp16) or "
        "bfloat16 only. Use dtype='float16' or 'bfloat16'."
    )


def _groups(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, overrides) of each engine group of a ``--sglang-config`` file whose model takes
    the training weights (``update_weights`` not false)."""
    data = read_yaml(path, "--sglang-config")
    models = data.get("sglang") if isinstance(data, Mapping) else None
    if not isinstance(models, list):
        raise PrecisionConfigError(
            f"--sglang-config {path!r} has no 'sglang' list of models, which slime requires "
            f"(SglangConfig.from_yaml)."
        )
    out = []
    for model in models:
        if not isinstance(model, Mapping) or model.get("update_weights") is False:
            continue
        groups = model.get("server_groups") or model.get("engine_groups") or []
        for group in groups:
            if not isinstance(group, Mapping) or group.get("worker_type") in _NO_ENGINE:
                continue
            overrides = {
                str(k).replace("-", "_"): v for k, v in (group.get("overrides") or {}).items()
            }
            if model.get("model_path") and "model_path" not in overrides:
                overrides["model_path"] = model["model_path"]
            label = f"model {model.get('name')!r}, {group.get('worker_type')} group"
            out.append((label, overrides))
    return out


def slime_engine_args(argv: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The SGLang fields of :data:`~precision_plugin.sglang.args.FIELDS` each of slime's engine
    groups gets from ``argv``, as ``_compute_server_args`` builds them: ``--sglang-*`` flags,
    then ``--fp16``'s ``dtype="float16"`` over ``--sglang-dtype``, then ``--sglang-config``
    overrides. One ``("SGLang engines", fields)`` pair without ``--sglang-config``."""
    if isinstance(argv, (str, bytes)) or not all(isinstance(a, str) for a in argv):
        raise PrecisionConfigError(
            f"check_slime_args(argv): expected slime's command line as a list of strings, got "
            f"{type(argv).__name__}."
        )
    parser = field_parser(
        "sglang-",
        SKIPPED,
        **{
            "--fp16": {"dest": "fp16", "action": "store_true"},
            "--hf-checkpoint": {"dest": "hf_checkpoint"},
            "--sglang-config": {"dest": "sglang_config"},
        },
    )
    given = vars(parser.parse_known_args(list(argv))[0])
    from precision_plugin._core.configs import SLIME

    SLIME.read_argv(argv)  # --fp16 with --bf16 (Megatron refuses the pair), typos of known flags
    base = dict(FIELDS)
    base.update({k: v for k, v in given.items() if k in FIELDS})
    base["model_path"] = given.get("hf_checkpoint")
    if given.get("fp16"):
        base["dtype"] = "float16"
    config = given.get("sglang_config")
    if config is None:
        return [("each of slime's SGLang engines", base)]
    return [
        (f"each of slime's SGLang engines ({label})", {**base, **overrides})
        for label, overrides in _groups(config)
    ]


@checked
def check_slime_args(
    argv: Sequence[str],
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Check a slime command line (``argv``, e.g. ``sys.argv[1:]`` of ``train.py``) against
    ``policy``: the Megatron learner's dtype (``--fp16`` or bf16), and each SGLang engine group's
    launch as [`check_server_args`][precision_plugin.sglang.check_server_args] checks it
    (``--sglang-config`` read from disk). ``error`` findings raise together under
    ``strictness="error"``; the findings are returned."""
    pol = resolve_policy(policy, what="precision_plugin.slime.check_slime_args()")
    env = os.environ if environ is None else environ
    engines = slime_engine_args(argv)
    learner = "float16" if "--fp16" in argv else "bfloat16"
    findings: list[Finding] = []
    if learner != pol.dtype:
        findings.append(
            Finding(
                FRAMEWORK,
                "error",
                f"slime's Megatron learner trains in {learner} (slime sets bf16 = not fp16) "
                f"while the policy is {pol.dtype}.",
                fix=f"use {' '.join(_flags(pol)) if pol.dtype != 'float32' else '--fp16'}",
            )
        )
    for where, values in engines:
        findings.extend(launch_findings(values, pol, env, where=where))
    return settle_findings(findings, pol)
