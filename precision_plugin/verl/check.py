"""Check a composed verl config against the policy: every contradiction, named in one message.

Works on verl's composed OmegaConf config, on plain dicts, and on verl's config dataclasses
(``RolloutConfig``, ``FSDPActorConfig``, ``FSDPEngineConfig``, ...) or any mix: values are read by
key or attribute, so nothing here imports verl or OmegaConf.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from precision_plugin._base.boundary import Invalid, Validator, checked, one_of, version_text
from precision_plugin._base.config_lookup import MISSING as _MISSING
from precision_plugin._base.config_lookup import UNSET as _UNSET
from precision_plugin._base.config_lookup import lookup, vars_of
from precision_plugin._base.config_lookup import raw_value as _raw
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.verl.contradiction import Contradiction
from precision_plugin.verl.layout import (
    NEW_ENGINE_SINCE,
    ROLLOUT,
    SHORT_NAME,
    STRATEGIES,
    TURBO_AUTOCAST,
    TURBO_PARAM_DTYPE,
    VERL_FSDP_SCALER,
    Layout,
    canonical_dtype,
    layout,
)

log = logging.getLogger("precision_plugin")

_FIX = "append $(precision-plugin verl-overrides) to the verl command line"
#: verl's FSDP engine (>= 0.8) and legacy critic use bf16 when mixed_precision is unset.
_FSDP_DEFAULT = "bfloat16"
_ROLE_NAMES = {"actor": "actor (learner)", "ref": "reference model", "critic": "critic"}


def _unset(key: str, role: str) -> Contradiction:
    return Contradiction(
        key,
        f"{key} is not set ('???', a mandatory value): verl refuses to start, and what the "
        f"{role} runs in cannot be checked",
        f"set {key}, or {_FIX}",
    )


def _verl_config(cfg: Any) -> Any:
    """The boundary check of ``check_config``'s ``cfg``: the whole composed verl config."""
    if cfg is None or isinstance(cfg, (str, bytes, os.PathLike)):
        what = "nothing" if cfg is None else "a path or text, not the config"
        raise Invalid(
            f"is {what}; pass the composed verl config (the OmegaConf object main_ppo gets, "
            f"OmegaConf.load(path) of a saved one, or a dict)"
        )
    if isinstance(cfg, (list, tuple)) or not (isinstance(cfg, Mapping) or vars_of(cfg)):
        raise Invalid("is not a config (a mapping or a config object); pass the composed config")
    if _raw(cfg, "actor_rollout_ref") in (_MISSING, None):
        keys = set(cfg) if isinstance(cfg, Mapping) else set(vars_of(cfg))
        if not keys:
            raise Invalid("is empty: there is nothing to check; pass the composed verl config")
        section = keys & {"rollout", "actor", "ref", "dtype", "fsdp_config", "megatron"}
        where = f"a section of it (with {', '.join(sorted(section))})" if section else "another"
        raise Invalid(
            f"has no actor_rollout_ref, so it is not the whole verl config but {where} "
            f"config; pass the whole composed config"
        )
    return cfg


_VERL_CONFIG = Validator("the whole composed verl config", _verl_config)


@checked
def fsdp_learner_dtype(section: Any, *, legacy: bool, critic: bool = False) -> str | None:
    """The dtype an FSDP learner section really computes in, as the given verl generation reads it.

    verl >= 0.8 and the legacy critic: ``mixed_precision.param_dtype`` (bf16 when unset); the
    legacy actor/reference (verl <= 0.7): ``fsdp_config.dtype`` (autocast and scaler).
    """
    if legacy and not critic:
        return canonical_dtype(lookup(section, "dtype", "bfloat16"))
    if legacy and critic:
        return "bfloat16"  # the legacy critic autocasts in bf16 whatever its config says
    return canonical_dtype(lookup(section, "mixed_precision.param_dtype", _FSDP_DEFAULT))


def _fsdp_findings(
    role: str, path: str, section: Any, policy: PrecisionPolicy, lay: Layout
) -> list[Contradiction]:
    want = policy.dtype
    name = _ROLE_NAMES[role]
    critic = role == "critic"
    legacy = lay.legacy and lay.strategy != "megatron"
    runs = fsdp_learner_dtype(section, legacy=legacy, critic=critic)
    declared = canonical_dtype(lookup(section, "dtype"))
    param = canonical_dtype(lookup(section, "mixed_precision.param_dtype"))
    out: list[Contradiction] = []
    if runs == want:
        if legacy and not critic and param is not None and param != want:
            out.append(
                Contradiction(
                    f"{path}.mixed_precision.param_dtype",
                    f"the {name} autocasts in {want} but keeps its FSDP parameters in {param} "
                    f"({path}.mixed_precision.param_dtype)",
                    f"set ++{path}.mixed_precision.param_dtype={SHORT_NAME[want]}, or {_FIX}",
                )
            )
        return out
    if not legacy and declared == want:
        out.append(
            Contradiction(
                f"{path}.dtype",
                f"the {name} has {path}.dtype={declared}, which verl {lay.version}'s FSDP engine "
                f"ignores (since verl 0.8 only Megatron reads it): it trains in {runs} "
                f"(mixed_precision.param_dtype) while the policy is {want}",
                f"set ++{path}.mixed_precision.param_dtype={SHORT_NAME[want]}, or {_FIX}",
            )
        )
    elif legacy and critic:
        out.append(
            Contradiction(
                path,
                f"the legacy FSDP critic of verl {lay.version} autocasts in bfloat16 whatever "
                f"its config says, so it cannot run the {want} policy",
                "upgrade to verl >= 0.8 (its FSDP engine reads mixed_precision for the critic "
                "too), or train without a critic (e.g. algorithm.adv_estimator=grpo)",
            )
        )
    elif legacy and param == want:
        out.append(
            Contradiction(
                f"{path}.dtype",
                f"the {name} has {path}.mixed_precision.param_dtype={param} but "
                f"{path}.dtype={declared}: verl {lay.version}'s legacy workers autocast and "
                f"scale in fsdp_config.dtype, so it computes in {runs}",
                f"set {path}.dtype={want}, or {_FIX}",
            )
        )
    else:
        key = f"{path}.dtype" if legacy else f"{path}.mixed_precision.param_dtype"
        out.append(
            Contradiction(
                key,
                f"the {name} trains in {runs} ({key}) while the policy is {want}",
                _FIX,
            )
        )
    return out


def _turbo_findings(
    role: str, path: str, section: Any, policy: PrecisionPolicy, lay: Layout
) -> list[Contradiction]:
    name = _ROLE_NAMES[role]
    strategy_key = "critic.strategy" if role == "critic" else "actor_rollout_ref.actor.strategy"
    if policy.dtype != TURBO_AUTOCAST:
        return [
            Contradiction(
                strategy_key,
                f"the {name} uses strategy=fsdp_turbo, whose engine (verl {lay.version}) replaces "
                f"_build_fsdp_module, where the FSDP engine sets its autocast dtype and float16 "
                f"loss scaler: it autocasts in {TURBO_AUTOCAST} with no loss scaler whatever "
                f"mixed_precision or turbo_config say, so it cannot run the {policy.dtype} policy",
                f"set {strategy_key}=fsdp (or fsdp2), or use dtype='bfloat16'",
            )
        ]
    param = canonical_dtype(lookup(section, TURBO_PARAM_DTYPE, "bf16"))
    if param == TURBO_AUTOCAST:
        return []
    return [
        Contradiction(
            f"{path}.{TURBO_PARAM_DTYPE}",
            f"the {name} (fsdp_turbo) keeps its parameters in {param} but autocasts in "
            f"{TURBO_AUTOCAST}",
            f"set ++{path}.{TURBO_PARAM_DTYPE}={SHORT_NAME[TURBO_AUTOCAST]}, or {_FIX}",
        )
    ]


def _turbo_role(cfg: Any, role: str, lay: Layout) -> bool:
    """True when ``role`` trains with FSDP-Turbo (the critic has its own ``critic.strategy``)."""
    if role == "critic":
        return lookup(cfg, "critic.strategy", lay.strategy) == "fsdp_turbo"
    return lay.turbo


def _megatron_findings(
    role: str, path: str, section: Any, policy: PrecisionPolicy
) -> list[Contradiction]:
    runs = canonical_dtype(lookup(section, "dtype", "bfloat16"))
    if runs == policy.dtype:
        return []
    return [
        Contradiction(
            f"{path}.dtype",
            f"the {_ROLE_NAMES[role]} (Megatron) trains in {runs} while the policy is "
            f"{policy.dtype}",
            _FIX,
        )
    ]


def _critic_in_use(cfg: Any) -> bool:
    enable = lookup(cfg, "critic.enable")
    if enable is not None:
        return bool(enable)
    return lookup(cfg, "algorithm.adv_estimator") == "gae"


def _ref_in_use(cfg: Any) -> bool:
    return bool(
        lookup(cfg, "algorithm.use_kl_in_reward")
        or lookup(cfg, "actor_rollout_ref.actor.use_kl_loss")
    )


def _lora_merge(cfg: Any) -> bool:
    model = lookup(cfg, "actor_rollout_ref.model")
    rank = lookup(model, "lora.rank", 0) or lookup(model, "lora_rank", 0) or 0
    return int(rank) > 0 and bool(lookup(model, "lora.merge", False))


@checked(cfg=_VERL_CONFIG, verl_version=version_text("verl"), strategy=one_of(*STRATEGIES))
def find_contradictions(
    cfg: Any,
    policy: PrecisionPolicy,
    *,
    verl_version: str | Version | None = None,
    strategy: str | None = None,
) -> list[Contradiction]:
    """Every contradiction between the composed verl config ``cfg`` and ``policy`` (pure)."""
    from precision_plugin._core.configs import VERL

    VERL.read_mapping(cfg, "the verl config")  # typos of known keys, quoted booleans, counts
    strategy = strategy or lookup(cfg, "actor_rollout_ref.actor.strategy", "fsdp")
    lay = layout(verl_version, "fsdp" if strategy == "fsdp2" else strategy)
    if lay.legacy and lookup(cfg, "trainer.use_legacy_worker_impl", "auto") == "disable":
        lay = Layout(lay.version, lay.strategy, False, lay.plugins, lay.learners)
    want = policy.dtype
    out: list[Contradiction] = []

    from precision_plugin.verl.sglang import rollout_dtype_key, sglang_contradictions

    has_rollout = lookup(cfg, ROLLOUT) is not None
    rollout_key = rollout_dtype_key(cfg)  # engine_kwargs.sglang.dtype wins on an SGLang rollout
    rollout = canonical_dtype(lookup(cfg, rollout_key, "bfloat16"))
    if has_rollout and _raw(cfg, rollout_key) is _UNSET:
        out.append(_unset(rollout_key, "rollout engine"))
    elif has_rollout and rollout != want:
        out.append(
            Contradiction(
                rollout_key,
                f"the rollout engine samples in {rollout} while the policy is {want}",
                f"set {rollout_key}={want}, or {_FIX}",
            )
        )
    if has_rollout:
        out.extend(sglang_contradictions(cfg, policy))

    for role, path in lay.learners.items():
        if role == "critic" and not _critic_in_use(cfg):
            continue
        section = lookup(cfg, path)
        if section is None or (role == "ref" and not _ref_in_use(cfg)):
            continue
        unset = [
            f"{path}.{key}"
            for key in ("dtype", "mixed_precision.param_dtype")
            if _raw(section, key) is _UNSET
        ]
        if unset:
            out.extend(_unset(key, _ROLE_NAMES[role]) for key in unset)
        elif lay.megatron:
            out.extend(_megatron_findings(role, path, section, policy))
        elif _turbo_role(cfg, role, lay):
            out.extend(_turbo_findings(role, path, section, policy, lay))
        else:
            out.extend(_fsdp_findings(role, path, section, policy, lay))

    if want == "float16":
        if _lora_merge(cfg) and not lay.megatron:
            out.append(
                Contradiction(
                    "actor_rollout_ref.model.lora.merge",
                    "LoRA with lora.merge=True syncs merged weights to the rollout cast to "
                    "bfloat16 (verl FSDP engine), so the float16 rollout runs bf16-rounded "
                    "weights",
                    "set actor_rollout_ref.model.lora.merge=False (adapters are synced unmerged)",
                )
            )
        backend = lookup(cfg, f"{ROLLOUT}.checkpoint_engine.backend")
        if backend == "delta_sharded":
            out.append(
                Contradiction(
                    f"{ROLLOUT}.checkpoint_engine.backend",
                    "the delta_sharded weight sync casts weights to bfloat16 before the "
                    "float16 rollout loads them",
                    f"set {ROLLOUT}.checkpoint_engine.backend=naive",
                )
            )
        scaler = policy.loss_scaler
        differs = {
            k: getattr(scaler, k) for k, v in VERL_FSDP_SCALER.items() if getattr(scaler, k) != v
        }
        has_actor = lookup(cfg, "actor_rollout_ref.actor") is not None
        if policy.uses_loss_scaler and not lay.megatron and not lay.turbo and has_actor and differs:
            asked = ", ".join(f"{k}={v}" for k, v in differs.items())
            out.append(
                Contradiction(
                    "policy.loss_scaler",
                    f"the policy asks for loss_scaler {asked}, but verl's FSDP loss scaler is "
                    f"hard-coded (ShardedGradScaler(growth_interval=400), torch's defaults "
                    f"otherwise): verl runs "
                    + ", ".join(f"{k}={VERL_FSDP_SCALER[k]}" for k in differs),
                    "use the default loss_scaler settings with verl",
                )
            )
        no_scaler = lay.version < NEW_ENGINE_SINCE and not lay.legacy
        if policy.uses_loss_scaler and not lay.megatron and no_scaler:
            out.append(
                Contradiction(
                    "trainer.use_legacy_worker_impl",
                    f"trainer.use_legacy_worker_impl=disable on verl {lay.version}: its new "
                    f"FSDP engine has no loss scaler (added in verl 0.8, verl#6150), so "
                    f"float16 gradients underflow",
                    "keep the legacy workers (use_legacy_worker_impl=auto) or upgrade to "
                    "verl >= 0.8",
                )
            )

    if (
        has_rollout
        and policy.metrics.enabled
        and not lookup(cfg, f"{ROLLOUT}.calculate_log_probs", False)
    ):
        out.append(
            Contradiction(
                f"{ROLLOUT}.calculate_log_probs",
                "rollout log-probs are off, so verl logs no train/rollout mismatch metrics "
                "(training/rollout_probs_diff_*, rollout_corr/*)",
                f"set {ROLLOUT}.calculate_log_probs=True",
            )
        )
    return out


@checked
def settle(
    problems: list[Contradiction], policy: PrecisionPolicy, where: str = "verl config"
) -> None:
    """Raise all ``problems`` as one :class:`PrecisionMismatchError` (strictness ``error``) or
    log them as one warning (``warn``). Nothing happens when there are none."""
    if not problems:
        return
    listed = "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
    head = (
        f"precision_plugin: the {where} contradicts the {policy.dtype} policy in "
        f"{len(problems)} place(s): {listed}"
    )
    if policy.strictness == "error":
        raise PrecisionMismatchError(f"{head}. Fix: {_FIX}.")
    log.warning("%s. verl runs as configured (strictness='warn').", head)


@checked(cfg=_VERL_CONFIG, verl_version=version_text("verl"), strategy=one_of(*STRATEGIES))
def check_config(
    cfg: Any,
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
    *,
    verl_version: str | Version | None = None,
    strategy: str | None = None,
) -> list[Contradiction]:
    """Check a composed verl config (OmegaConf, dict or verl dataclasses) against the policy.

    Reports every contradiction: rollout and learner dtypes that differ (including
    ``fsdp_config.dtype`` set where verl >= 0.8 ignores it), a reference model in another dtype,
    a LoRA-merge or delta-shard weight sync that casts to bf16 under a float16 rollout, a
    float16 learner without a loss scaler, an FSDP-Turbo learner (``strategy=fsdp_turbo``,
    verl >= 0.9.1), which computes in bf16 without a scaler whatever the config says, under a
    float16 or float32 policy, and mismatch metrics switched off. Under
    ``strictness="error"`` they are raised together as one :class:`PrecisionMismatchError`,
    else logged as one warning. ``policy`` goes through
    :func:`precision_plugin._core.manager.resolve_policy`; ``verl_version`` defaults to the
    installed
    verl, ``strategy`` to ``actor_rollout_ref.actor.strategy``. Returns the contradictions.
    Anything but the whole composed config (``None``, a path, a list, an empty dict, one of its
    sections) is refused: an empty answer must mean the config was checked.
    """
    pol = resolve_policy(policy)
    problems = find_contradictions(cfg, pol, verl_version=verl_version, strategy=strategy)
    settle(problems, pol)
    return problems
