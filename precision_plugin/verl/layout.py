"""Where verl keeps each precision setting, by verl version and learner strategy (pure, no verl).

Checked against verl's own ``verl/trainer/config/_generated_ppo{,_megatron}_trainer.yaml`` and
worker code of the PyPI releases 0.7.1, 0.8.0 and 0.9.1:

- rollout: ``actor_rollout_ref.rollout.dtype`` (vLLM/SGLang ``dtype``), every version;
  ``actor_rollout_ref.rollout.calculate_log_probs`` (default false before 0.9, true from 0.9).
- FSDP, verl <= 0.7 (legacy workers, the default ``trainer.use_legacy_worker_impl=auto``): the
  actor and reference autocast in ``fsdp_config.dtype`` and build their ``ShardedGradScaler`` from
  it (``dp_actor.py``); the FSDP parameter dtype is ``fsdp_config.mixed_precision.param_dtype``
  when set, else ``fsdp_config.dtype``. The legacy critic reads only ``mixed_precision`` and
  autocasts in bf16 whatever the config says. Critic section: ``critic.model.fsdp_config``.
- FSDP, verl >= 0.8 (#6067 removed the legacy workers): the engine reads only
  ``fsdp_config.mixed_precision.param_dtype`` (default bf16) for parameters, autocast and the
  scaler; ``fsdp_config.dtype`` still validates but only Megatron reads it. Critic section:
  ``critic.fsdp``.
- FSDP-Turbo, verl >= 0.9.1 (``actor_rollout_ref.actor.strategy=fsdp_turbo``): parameters in
  ``fsdp_config.turbo_config.distributed.fsdp_plan.param_dtype`` (default bf16); its engine
  replaces ``_build_fsdp_module``, where the FSDP engine sets its autocast dtype and float16
  loss scaler, so it autocasts in bf16 with no scaler whatever ``mixed_precision`` says.
- Megatron (``ppo_megatron_trainer``): ``<role>.megatron.dtype`` (``bfloat16`` or ``float16``
  only), every version.
- vLLM engine kwargs: ``actor_rollout_ref.rollout.engine_kwargs.vllm.<name>``.
- Ray workers' environment: ``ray_kwargs.ray_init.runtime_env.env_vars.<NAME>`` (merged over
  verl's defaults in ``main_ppo.run_ppo``).
- ``verl.plugins`` entry points are loaded by ``import verl`` from 0.9.0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from precision_plugin._base import versions
from precision_plugin._base.boundary import checked, one_of, version_text
from precision_plugin._base.dtypes import SHORT_NAMES, SUPPORTED_DTYPES, dtype_label, spellings
from precision_plugin.errors import PrecisionConfigError

log = logging.getLogger(__name__)

#: First release without the legacy FSDP workers (verl#6067).
NEW_ENGINE_SINCE = Version("0.8.0")
#: First release whose ``import verl`` loads the ``verl.plugins`` entry-point group.
PLUGINS_SINCE = Version("0.9.0")
#: First release with the FSDP-Turbo engine (``strategy: fsdp_turbo``).
TURBO_SINCE = Version("0.9.1")
#: Where FSDP-Turbo keeps its parameter dtype, under an FSDP learner section.
TURBO_PARAM_DTYPE = "turbo_config.distributed.fsdp_plan.param_dtype"
#: What FSDP-Turbo computes in: ``FSDPEngine.__init__``'s defaults, which it never overrides.
TURBO_AUTOCAST = "bfloat16"
#: The releases the keys were checked against (the module docstring): a version asked for
#: below the first is refused (its keys are unknown), above the last is warned about.
CHECKED_RELEASES = (Version("0.7.1"), Version("0.8.0"), Version("0.9.1"))
#: The layout assumed when no verl is installed and no version is given: the newest checked.
ASSUMED_VERSION = CHECKED_RELEASES[-1]

STRATEGIES = ("fsdp", "fsdp2", "fsdp_turbo", "megatron")

#: verl's FSDP loss scaler: ``ShardedGradScaler(growth_interval=400)`` with torch's other
#: defaults, hard-coded in the legacy actor (verl#4036) and the FSDP engine (verl#6150).
VERL_FSDP_SCALER = {
    "init_scale": 2.0**16,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 400,
}

#: verl's entry-point group (``verl/__init__.py``, >= 0.9) and this plugin's name in it.
ENTRY_POINT_GROUP = "verl.plugins"
ENTRY_POINT_NAME = "precision_plugin"

ROLLOUT = "actor_rollout_ref.rollout"
VLLM_ENGINE_KWARGS = f"{ROLLOUT}.engine_kwargs.vllm"
RAY_ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"

#: verl's spellings: ``dtype`` fields take torch names, ``mixed_precision`` short ones.
LONG_NAME = {name: name for name in SUPPORTED_DTYPES}
SHORT_NAME = dict(SHORT_NAMES)
#: Every spelling verl reads, mapped through the one vocabulary (``precision_plugin._base.dtypes``).
_CANONICAL = spellings(("float16", "fp16", "half", "16", "bfloat16", "bf16", "float32", "fp32",
                        "float", "32"))  # fmt: skip


@checked
def canonical_dtype(value: object) -> str | None:
    """verl's many spellings of a dtype (``fp16``, ``float16``, 16, ``torch.float16``) -> one."""
    if value is None:
        return None
    return dtype_label(value)


@checked
@dataclass(frozen=True)
class Layout:
    """The precision keys of one verl version and learner strategy.

    ``learners`` maps a role (``actor``, ``ref``, ``critic``) to the config path of its engine
    section; ``legacy`` says the FSDP legacy workers are verl's default (verl < 0.8).
    """

    version: Version
    strategy: str
    legacy: bool
    plugins: bool
    learners: dict[str, str]

    @property
    def megatron(self) -> bool:
        """True for the Megatron learner."""
        return self.strategy == "megatron"

    @property
    def turbo(self) -> bool:
        """True for the FSDP-Turbo learner (verl >= 0.9.1)."""
        return self.strategy == "fsdp_turbo"


@checked(version=version_text("verl"))
def verl_version(version: str | Version | None = None) -> Version:
    """``version`` when given, else the installed verl's, else :data:`ASSUMED_VERSION`."""
    if version is None:
        return versions.installed_version("verl") or ASSUMED_VERSION
    try:
        asked = versions.parse_version(version)
    except InvalidVersion:
        raise PrecisionConfigError(
            f"verl version {version!r} was given, which is not a version number; pass one "
            f"such as '0.9.1' (or nothing, for the installed verl)."
        ) from None
    first, last = CHECKED_RELEASES[0], CHECKED_RELEASES[-1]
    checked_text = ", ".join(str(v) for v in CHECKED_RELEASES)
    if asked.release[:2] < first.release[:2]:
        raise PrecisionConfigError(
            f"verl {asked} was asked for; precision_plugin knows verl's precision keys from "
            f"{first.major}.{first.minor} on (checked against {checked_text}), and older releases "
            f"keep them elsewhere. Upgrade verl, or set the dtype keys of your version yourself."
        )
    if asked.release[:2] > last.release[:2]:
        log.warning(
            "precision_plugin: verl %s is newer than the releases its keys were checked against "
            "(%s); the keys of verl %s are used",
            asked,
            checked_text,
            last,
        )
    return asked


@checked(version=version_text("verl"), strategy=one_of(*STRATEGIES))
def layout(version: str | Version | None = None, strategy: str = "fsdp") -> Layout:
    """The :class:`Layout` of verl ``version`` (default: installed) for ``strategy``."""
    v = verl_version(version)
    if strategy == "fsdp_turbo" and v < TURBO_SINCE:
        raise PrecisionConfigError(
            f"verl strategy 'fsdp_turbo' was asked for with verl {v}; the FSDP-Turbo engine "
            f"exists from verl {TURBO_SINCE}. Use strategy='fsdp', or upgrade verl."
        )
    legacy = v < NEW_ENGINE_SINCE
    if strategy == "megatron":
        learners = {
            "actor": "actor_rollout_ref.actor.megatron",
            "ref": "actor_rollout_ref.ref.megatron",
            "critic": "critic.megatron",
        }
    else:
        learners = {
            "actor": "actor_rollout_ref.actor.fsdp_config",
            "ref": "actor_rollout_ref.ref.fsdp_config",
            "critic": "critic.model.fsdp_config" if legacy else "critic.fsdp",
        }
    return Layout(v, strategy, legacy, v >= PLUGINS_SINCE, learners)
