"""verl's SGLang rollout (``actor_rollout_ref.rollout.name=sglang``) against real verl: the
overrides, the keys verl hands to SGLang's ``ServerArgs``, and the config check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import verl
from conftest import compose_verl
from verl.utils.config import omega_conf_to_dataclass

from precision_plugin import PrecisionPolicy
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.verl import check_config, overrides
from precision_plugin.verl.plugin import check_section

SGLANG = ["actor_rollout_ref.rollout.name=sglang", "algorithm.adv_estimator=grpo"]
ENGINE_KWARGS = "actor_rollout_ref.rollout.engine_kwargs.sglang"
STRICT = PrecisionPolicy(strictness="error")


def server_args_dtype(rollout) -> str:
    """The ``dtype`` verl passes to SGLang's ``ServerArgs`` for this rollout config, following
    the order of verl's own code: ``"dtype": self.config.dtype`` first, then
    ``**engine_kwargs`` (``engine_kwargs.sglang``) spread over it."""
    source = (
        Path(verl.__file__).parent / "workers/rollout/sglang_rollout/async_sglang_server.py"
    ).read_text()
    dtype_at = source.index('"dtype": self.config.dtype,')
    spread_at = source.index("**engine_kwargs,", dtype_at)
    assert re.search(r'get\("sglang", \{\}\)', source[:spread_at]), "engine_kwargs.sglang moved"
    assert dtype_at < spread_at
    return {"dtype": rollout.dtype, **rollout.engine_kwargs.get("sglang", {})}["dtype"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_overrides_reach_the_sglang_server_args(dtype):
    cfg = compose_verl([*SGLANG, *overrides(dtype, rollout="sglang")])
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.name == "sglang" and rollout.engine_kwargs["sglang"]["dtype"] == dtype
    assert server_args_dtype(rollout) == dtype
    assert "vllm" not in str(cfg.actor_rollout_ref.rollout.engine_kwargs.get("vllm") or {})
    assert check_config(cfg, PrecisionPolicy(dtype=dtype, strictness="error")) == []


def test_engine_kwargs_dtype_wins_and_is_what_is_checked():
    cfg = compose_verl(
        [
            *SGLANG,
            *overrides("float16", rollout="sglang"),
            f"++{ENGINE_KWARGS}.dtype=bfloat16",  # after ours: the user's wins in Hydra
        ]
    )
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.dtype == "float16" and server_args_dtype(rollout) == "bfloat16"
    with pytest.raises(PrecisionMismatchError, match=rf"\[{ENGINE_KWARGS}\.dtype\]"):
        check_config(cfg, STRICT)
    with pytest.raises(PrecisionMismatchError, match="samples in bfloat16"):
        check_section(rollout, STRICT)  # what the verl.plugins hook does in the worker


def test_sglang_traps_in_verls_config():
    base = [*SGLANG, *overrides("float16", rollout="sglang")]
    rl = compose_verl([*base, f"++{ENGINE_KWARGS}.rl_on_policy_target=fsdp"])
    with pytest.raises(PrecisionMismatchError, match="rl-on-policy-target fsdp"):
        check_config(rl, STRICT)
    nan = compose_verl(
        [*base, "++ray_kwargs.ray_init.runtime_env.env_vars.SGLANG_SANITIZE_NAN_LOGITS=1"]
    )
    with pytest.raises(PrecisionMismatchError, match="SGLANG_SANITIZE_NAN_LOGITS"):
        check_config(nan, STRICT)
    vllm = compose_verl(
        [
            "algorithm.adv_estimator=grpo",
            *overrides("float16", vllm_version=None, gpu_capability=None),
            f"++{ENGINE_KWARGS}.rl_on_policy_target=fsdp",
        ]
    )
    assert check_config(vllm, STRICT) == []  # a vLLM rollout does not read engine_kwargs.sglang


def test_the_command_line_with_rollout_sglang_composes():
    cli = [sys.executable, "-m", "precision_plugin", "verl-overrides", "--engine", "sglang"]
    text = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    cfg = compose_verl([*SGLANG, *text.split()])
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert server_args_dtype(rollout) == "float16"
    assert check_config(cfg, STRICT) == []
