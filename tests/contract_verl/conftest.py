"""Contract tests run in a separate verl environment (scripts/setup_verl_env.sh), on CPU.

They compose verl's real ``ppo_trainer`` / ``ppo_megatron_trainer`` configs with Hydra's compose
API from the config directory inside the installed verl, and convert sections with verl's own
``omega_conf_to_dataclass``, as verl's workers do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("PRECISION_PLUGIN", None)

verl = pytest.importorskip("verl", reason="the verl contract environment is not active")

from hydra import compose, initialize_config_dir  # noqa: E402
from packaging.version import Version  # noqa: E402

from tests import contract_support  # noqa: E402

VERL_VERSION = Version(verl.__version__)
CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
ROOT = Path(__file__).resolve().parents[2]

#: What verl's own ``main_ppo`` insists on before a config converts: a rollout engine name and a
#: micro-batch size (an assertion in ActorConfig/CriticConfig.__post_init__).
REQUIRED = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
]


def config_name(strategy: str) -> str:
    """verl's top-level config for a learner strategy."""
    return "ppo_megatron_trainer" if strategy == "megatron" else "ppo_trainer"


def compose_verl(overrides: list[str], strategy: str = "fsdp") -> Any:
    """verl's composed config (an OmegaConf ``DictConfig``) with ``overrides`` applied."""
    extra = [] if strategy == "megatron" else [f"actor_rollout_ref.actor.strategy={strategy}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name(strategy), overrides=[*REQUIRED, *extra, *overrides])


def run_installed(code: str, cwd: Path, **env: str) -> dict[str, str]:
    """Run ``code`` against the installed precision_plugin, ``PRECISION_PLUGIN``/
    ``VERL_USE_EXTERNAL_*`` cleared, then ``env`` applied
    (``tests.contract_support.run_installed``)."""
    drop = ("PRECISION_PLUGIN", "VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")
    return contract_support.run_installed(code, cwd, drop=drop, env=env, timeout=240)
