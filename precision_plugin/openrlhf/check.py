"""Check OpenRLHF's parsed ``train_ppo_ray`` arguments against the policy: every contradiction
in one message.

Works on what OpenRLHF's parser returns (the flat ``argparse.Namespace`` with dotted names, or
the nested namespace of its ``hierarchize``) and on plain dicts (nested, or with dotted keys).
OpenRLHF itself is never imported: what the installed version does is read from its source
(``precision_plugin.openrlhf.installed``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from precision_plugin._base.boundary import Invalid, Validator, checked, version_text
from precision_plugin._base.config_lookup import lookup
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._base.dtypes import SUPPORTED_DTYPES
from precision_plugin._base.report import Finding
from precision_plugin._core import frameworks
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.openrlhf.installed import RELEASED_WEIGHT_SYNC, WeightSync, installed
from precision_plugin.openrlhf.launch import _carried_env, env_value, learner_flags
from precision_plugin.openrlhf.layout import (
    DEEPSPEED_FP16_SCALER,
    ENGINE_DTYPE,
    IS_LEVEL_SINCE,
    LOAD_IN_4BIT,
    MODEL,
    NUM_ENGINES,
    PARAM_DTYPE,
    TENSOR_PARALLEL,
    Layout,
    flag,
    layout,
)
from precision_plugin.policy import ENV_VAR, LossScalerSettings, PrecisionPolicy

FRAMEWORK = "openrlhf"
_MISSING: Any = object()
_TORCH = {name: f"torch.{name}" for name in SUPPORTED_DTYPES}


def arg(args: Any, key: str, default: Any = None) -> Any:
    """The value of parsed-argument ``key`` (``ds.param_dtype``): nested (after
    ``hierarchize``) or flat with the dotted name (``getattr(args, "ds.param_dtype")``)."""
    value = lookup(args, key, _MISSING)
    if value is _MISSING:
        value = (
            args.get(key, _MISSING) if isinstance(args, Mapping) else getattr(args, key, _MISSING)
        )
    return default if value is _MISSING else value


def _has(args: Any, key: str) -> bool:
    return arg(args, key, _MISSING) is not _MISSING


def _count(value: Any, key: str) -> int:
    """A parsed-argument count (``ds.tensor_parallel_size``) as an int; ``None`` is 1. A value
    OpenRLHF's parser would refuse (``"two"``, ``2.5``) is a ``PrecisionConfigError`` naming the
    flag."""
    if value is None:
        return 1
    try:
        count = int(str(value).strip())
    except ValueError:
        raise PrecisionConfigError(
            f"{flag(key)} is {value!r} in the arguments, which OpenRLHF's parser would refuse "
            f"(it takes an integer); pass an integer such as 1, or parse the command line with "
            f"precision_plugin.openrlhf.parse_args(argv)."
        ) from None
    return count


def _error(message: str, fix: str, **details: Any) -> Finding:
    return Finding(FRAMEWORK, "error", message, fix=fix, details=details)


def _env_fix(policy: PrecisionPolicy) -> str:
    value = shlex.quote(env_value(policy))
    submit = json.dumps(_carried_env(policy), separators=(",", ":"))
    return (
        f"export {ENV_VAR}={value} before the run, so that the Ray cluster it starts gives it to "
        f"every actor (on a running cluster: ray job submit --runtime-env-json '{submit}' -- "
        f"python3 -m openrlhf.cli.train_ppo_ray ...)"
    )


def _learner(args: Any, policy: PrecisionPolicy, lay: Layout) -> tuple[str | None, list[Finding]]:
    param_dtype = str(arg(args, PARAM_DTYPE, "bf16"))
    runs = frameworks.openrlhf_learner_dtype(param_dtype)
    want = policy.dtype
    if frameworks.openrlhf_param_dtype(policy) is None:
        fix = "use dtype='float16' or 'bfloat16' with OpenRLHF"
        found = [
            _error(f"OpenRLHF's learner runs bf16 or fp16 only, the policy asks for {want}", fix)
        ]
        return runs, found
    if runs == want:
        return runs, [
            Finding(
                FRAMEWORK, "ok", f"the learner trains in {want} ({flag(PARAM_DTYPE)} {param_dtype})"
            )
        ]
    fix = "add " + " ".join(learner_flags(policy, lay.version))
    shown = runs or f"an unknown dtype ({param_dtype!r})"
    message = (
        f"the learner trains in {shown} ({flag(PARAM_DTYPE)} {param_dtype}) while the policy "
        f"is {want}"
    )
    return runs, [_error(message, f"{fix} (or $(precision-plugin openrlhf-args))")]


def _bf16_only(args: Any, policy: PrecisionPolicy) -> list[Finding]:
    if policy.dtype != "float16":
        return []
    out = []
    tp = _count(arg(args, TENSOR_PARALLEL, 1), TENSOR_PARALLEL)
    if tp > 1:
        out.append(
            _error(
                f"{flag(TENSOR_PARALLEL)} {tp} (DeepSpeed AutoTP) cannot train in float16: "
                f"OpenRLHF asserts bf16 for tensor-parallel training and shards the model in "
                f"bfloat16 (utils/deepspeed/deepspeed.py)",
                f"use {flag(TENSOR_PARALLEL)} 1 (ZeRO-3 shards without AutoTP), or "
                f"dtype='bfloat16'",
            )
        )
    if arg(args, LOAD_IN_4BIT, False):
        out.append(
            _error(
                f"{flag(LOAD_IN_4BIT)} cannot train in float16: OpenRLHF asserts bf16 for 4-bit "
                f"loading (bnb_4bit_compute_dtype=bfloat16) and casts the LoRA layers, lm_head "
                f"and embeddings to bfloat16 (models/actor.py)",
                f"drop {flag(LOAD_IN_4BIT)} (LoRA without 4-bit trains in float16), or "
                f"dtype='bfloat16'",
            )
        )
    return out


def _importance_sampling(args: Any, policy: PrecisionPolicy, lay: Layout) -> list[Finding]:
    retired = lay.retired_is_switch
    if _has(args, retired):
        which = f"< {IS_LEVEL_SINCE}" if lay.version >= IS_LEVEL_SINCE else f">= {IS_LEVEL_SINCE}"
        return [
            _error(
                f"the arguments carry {flag(retired)}, a flag of OpenRLHF {which}; OpenRLHF "
                f"{lay.version} spells the importance-sampling switch {flag(lay.is_switch)}",
                f"use {' '.join(lay.is_on_flags())} (or parse the arguments with this OpenRLHF)",
            )
        ]
    value = arg(args, lay.is_switch, "off" if lay.version >= IS_LEVEL_SINCE else False)
    on = value not in (None, False, "off")
    if on:
        return [
            Finding(
                FRAMEWORK,
                "ok",
                f"importance-sampling correction is on ({flag(lay.is_switch)} {value}): OpenRLHF "
                f"logs vllm_kl, precision_plugin's k1_kl (train/rollout mismatch)",
            )
        ]
    if not policy.metrics.enabled:
        return []
    return [
        Finding(
            FRAMEWORK,
            "warning",
            f"importance-sampling correction is off, so OpenRLHF {lay.version} logs no "
            f"train/rollout mismatch (vllm_kl, precision_plugin's k1_kl, is logged only with it)",
            fix=f"to measure the mismatch add {' '.join(lay.is_on_flags())}; it also reweights "
            f"the policy loss by pi_train/pi_rollout",
        )
    ]


def _scaler(policy: PrecisionPolicy) -> list[Finding]:
    if policy.dtype != "float16":
        return []
    asked = dataclasses.asdict(policy.loss_scaler)
    defaults = dataclasses.asdict(LossScalerSettings())
    runs = DEEPSPEED_FP16_SCALER
    explicit = {k: asked[k] for k in runs if asked[k] != defaults[k] and asked[k] != runs[k]}
    ran = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in runs.items())
    if explicit:
        shown = ", ".join(f"{k}={v}" for k, v in explicit.items())
        return [
            _error(
                f"the policy asks for loss_scaler {shown}, but OpenRLHF's fp16 DeepSpeed section "
                f"sets only enabled, so DeepSpeed's dynamic loss scaler runs with its defaults "
                f"({ran})",
                "use the default loss_scaler settings with OpenRLHF",
            )
        ]
    return [
        Finding(
            FRAMEWORK,
            "info",
            f"DeepSpeed's dynamic loss scaler runs with its defaults ({ran}): OpenRLHF has no "
            f"flag for the policy's growth_interval={policy.loss_scaler.growth_interval}",
        )
    ]


def _sync_clause(learner: str | None, engine: str, sync: WeightSync) -> str:
    if sync.casts_to in ("bfloat16", "float16"):
        return (
            f"; the weight sync {sync.describe()}, so the engines run {sync.casts_to}-rounded "
            f"weights without an error"
        )
    if learner is not None and learner != engine and sync.asserts:
        return (
            f"; the first weight sync then fails (WorkerWrap.update_weight asserts the dtypes "
            f"match: 'mismatch dtype: src {_TORCH[learner]}, dst {_TORCH[engine]}')"
        )
    return ""


def _engines(
    args: Any,
    policy: PrecisionPolicy,
    learner: str | None,
    environ: Mapping[str, str],
) -> list[Finding]:
    from precision_plugin.vllm.engine import decide_cascade, vllm_version

    if not arg(args, NUM_ENGINES):
        return [
            Finding(
                FRAMEWORK,
                "info",
                f"no vLLM engines ({flag(NUM_ENGINES)} unset or 0): nothing to check on the "
                f"rollout side",
            )
        ]
    found = installed()
    hard = (found.engine_dtype if found else None) or ENGINE_DTYPE
    sync = found.weight_sync if found else RELEASED_WEIGHT_SYNC
    requested = PrecisionPolicy.from_env(environ)
    follows = requested is not None and requested.vllm.enforce_dtype
    engine = requested.dtype if follows and requested else hard
    want = policy.dtype
    out: list[Finding] = []
    if engine != want:
        why = (
            f"{ENV_VAR}={environ.get(ENV_VAR)} in this environment"
            if follows
            else f"create_vllm_engines hard-codes dtype={hard!r}"
        )
        out.append(
            _error(
                f"OpenRLHF's vLLM engines sample in {engine} ({why}) while the policy is {want}"
                + _sync_clause(learner, engine, sync),
                _env_fix(policy),
                engine_dtype=engine,
            )
        )
    elif sync.casts_to in ("bfloat16", "float16") and sync.casts_to != want:
        out.append(
            _error(
                f"this OpenRLHF's weight sync {sync.describe()} (OpenRLHF#1348), so engines "
                f"running {want} get {sync.casts_to}-rounded weights without an error",
                "use an OpenRLHF whose weight sync sends param.dtype (every release up to "
                "0.11.2), or dtype='bfloat16'",
            )
        )
    else:
        out.append(
            Finding(
                FRAMEWORK,
                "ok",
                f"{ENV_VAR} reaches the engines: the vLLM general plugin replaces OpenRLHF's "
                f"hard-coded dtype={hard!r} with {want} in each engine and says so in the "
                f"engine actor's log; the weight sync {sync.describe()}",
            )
        )
    if requested is not None and environ.get("RAY_ADDRESS"):
        out.append(
            Finding(
                FRAMEWORK,
                "info",
                f"RAY_ADDRESS is set: the actors of a cluster started elsewhere do not inherit "
                f"this shell's {ENV_VAR}; it reaches them only through the job's runtime env",
                fix=_env_fix(policy),
            )
        )
    info = vllm_version()
    if info is None:
        out.append(
            Finding(
                FRAMEWORK,
                "info",
                f"vLLM is not installed where this check runs: the cascade-attention guard runs "
                f"inside each engine once {ENV_VAR} reaches it",
            )
        )
        return out
    decision = decide_cascade(policy)
    if decision.disables and not follows:
        out.append(
            _error(
                f"{decision.summary()} OpenRLHF passes no disable_cascade_attn to its engines",
                _env_fix(policy),
                cascade=decision.action,
            )
        )
    elif decision.disables:
        out.append(Finding(FRAMEWORK, "ok", f"in each engine, {decision.summary()}"))
    return out


def _model(args: Any, policy: PrecisionPolicy) -> list[Finding]:
    from precision_plugin._core.model_risks import config_json_for, model_findings

    path = config_json_for(arg(args, MODEL))
    if path is None or not arg(args, NUM_ENGINES):
        return []
    return model_findings(path, policy, raise_on_refusal=False)


def typed_args(args: Any) -> dict[str, Any]:
    """The arguments the check reads, each as OpenRLHF's parser gives it
    ([`OPENRLHF`][precision_plugin._core.configs.OPENRLHF]): ``vllm.num_engines "0"`` is 0 engines,
    ``is_correction_level "false"`` is refused (off, token or seq), a string for a switch is
    refused, a typo of a known key names the key it is close to."""
    from precision_plugin._core.configs import OPENRLHF

    source = "the parsed arguments"
    if isinstance(args, Mapping) or type(args).__module__ == "argparse":
        OPENRLHF.read_mapping(args, source)  # typos of known keys, as the parser would refuse
    out: dict[str, Any] = {}
    for key in OPENRLHF.by_path:
        raw = arg(args, key, _MISSING)
        if raw is not _MISSING:
            out[key] = OPENRLHF.value(key, raw, source)
    for key, least in _LEAST.items():
        value = out.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            raise PrecisionConfigError(
                f"{flag(key)} is {value} in {source}, below {least}: no count of "
                f"{_COUNTED[key]}; pass {least} or more"
                + (" (0: no vLLM engines)" if least == 0 else "")
                + "."
            )
    return out


#: The least each count OpenRLHF reads can be (``vllm.num_engines -1`` read as engines that
#: follow the policy was a check of engines that do not exist).
_LEAST = {NUM_ENGINES: 0, TENSOR_PARALLEL: 1, "vllm.tensor_parallel_size": 1}
_COUNTED = {
    NUM_ENGINES: "vLLM engines",
    TENSOR_PARALLEL: "DeepSpeed tensor-parallel ranks",
    "vllm.tensor_parallel_size": "GPUs per vLLM engine",
}


def _parsed_args(args: Any) -> Any:
    """The boundary check of OpenRLHF's parsed arguments: a namespace or a dict."""
    if not isinstance(args, Mapping) and (
        isinstance(args, (str, bytes, list, tuple)) or not hasattr(args, "__dict__")
    ):
        raise Invalid(
            "is not OpenRLHF's parsed arguments (the namespace train_ppo_ray's parser returns, "
            "or a dict); to check a command line use precision_plugin.openrlhf.parse_args(argv) "
            "first"
        )
    if not any(_has(args, key) for key in _READ):
        raise Invalid(
            f"holds none of OpenRLHF's arguments ({', '.join(_READ)}), so there is nothing to "
            f"check; pass what train_ppo_ray's parser returns "
            f"(precision_plugin.openrlhf.parse_args(argv))"
        )
    return args


#: Arguments train_ppo_ray's parser always sets; parsed arguments hold at least one of them.
_READ = (PARAM_DTYPE, MODEL, NUM_ENGINES)
_ARGS = Validator("OpenRLHF's parsed arguments", _parsed_args)
_VERSION = version_text("OpenRLHF", "0.11.2")


@checked(args=_ARGS, openrlhf_version=_VERSION)
def find_problems(
    args: Any,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    openrlhf_version: str | Version | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Every finding about OpenRLHF's parsed ``args`` under ``policy`` (nothing raised or logged):
    ``error`` findings are the contradictions. ``environ`` (default ``os.environ``) is the
    environment the Ray actors get; see
    [`check_args`][precision_plugin.openrlhf.check_args] for what is checked."""
    return _problems(
        args, resolve_policy(policy), openrlhf_version=openrlhf_version, environ=environ
    )


def _problems(
    args: Any,
    policy: PrecisionPolicy,
    *,
    openrlhf_version: str | Version | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    """``find_problems`` for a resolved ``policy``."""
    lay = layout(openrlhf_version)
    env = os.environ if environ is None else environ
    args = typed_args(args)
    learner, findings = _learner(args, policy, lay)
    findings += _bf16_only(args, policy)
    findings += _engines(args, policy, learner, env)
    findings += _model(args, policy)
    findings += _scaler(policy)
    findings += _importance_sampling(args, policy, lay)
    return findings


def settle(findings: list[Finding], policy: PrecisionPolicy) -> None:
    """Raise the ``error`` findings as one
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError]
    (``strictness="error"``) or log them as one warning; nothing when there are none."""
    problems = [f for f in findings if f.status == "error"]
    if not problems:
        return
    listed = "; ".join(f"({i}) {p.message} (fix: {p.fix})" for i, p in enumerate(problems, 1))
    settle_conflict(
        policy.strictness,
        f"the OpenRLHF arguments contradict the {policy.dtype} policy in {len(problems)} "
        f"place(s): {listed}",
        fix="the one named with each",
        outcome="OpenRLHF runs as configured (strictness='warn')",
    )


@checked(args=_ARGS, openrlhf_version=_VERSION)
def check_args(
    args: Any,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    openrlhf_version: str | Version | None = None,
) -> list[Finding]:
    """Check OpenRLHF's parsed ``train_ppo_ray`` arguments against the policy.

    Reports every contradiction: the learner's ``--ds.param_dtype`` against the policy;
    AutoTP or 4-bit loading with float16 (OpenRLHF asserts bf16 for both); vLLM engines that
    run OpenRLHF's hard-coded bf16 because ``PRECISION_PLUGIN`` does not reach them, with what
    the installed version's weight sync then does (the released versions assert and fail at
    the first sync; OpenRLHF#1348 would cast silently); a weight sync that casts to a fixed
    dtype; the cascade-attention guard of the installed vLLM when the engines are not reached;
    a checkpoint vLLM refuses in float16; loss-scaler settings OpenRLHF cannot pass; the
    importance-sampling flags of the other OpenRLHF generation. Under ``strictness="error"``
    they are raised together as one
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError], else logged as
    one warning; each fix says exactly what to add. Returns every finding (``error`` ones are
    the contradictions; ``warning``/``info``/``ok`` ones, such as "no mismatch metric without
    the IS correction", are advice). ``policy`` goes through
    [`resolve_policy`][precision_plugin._core.manager.resolve_policy]; ``openrlhf_version`` defaults
    to the installed OpenRLHF.
    """
    pol = resolve_policy(policy)
    findings = _problems(args, pol, openrlhf_version=openrlhf_version)
    settle(findings, pol)
    return findings
