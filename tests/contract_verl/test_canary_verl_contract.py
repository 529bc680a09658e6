"""The canary's verl hook points against real verl (0.9.1 and 0.7.1): the per-batch metrics
read a real ``DataProto``'s ``old_log_probs``/``rollout_log_probs``/``response_mask`` (the keys
verl's own ``calculate_debug_metrics`` reads), a canary check takes the actor's padded
log-probs, and ``batch_invariant='on'`` reaches the Ray workers' ``env_vars`` through verl's
own merge in ``main_ppo``."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import compose_verl
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
from verl.utils.debug.metrics import calculate_debug_metrics

from precision_plugin import PrecisionPolicy
from precision_plugin._core.canary import CanaryMonitor
from precision_plugin._core.canary.workers import batch_metrics, check_canary
from precision_plugin.verl import overrides

OLD = torch.tensor([[-1.0, -2.0, -0.25], [-0.5, -3.0, -1.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.75], [-0.5, -3.0, -4.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def rollout_batch(rollout: torch.Tensor) -> DataProto:
    return DataProto.from_dict(
        tensors={
            "old_log_probs": OLD,
            "rollout_log_probs": rollout,
            "response_mask": MASK,
            "responses": torch.zeros(2, 3, dtype=torch.long),
        }
    )


def test_batch_metrics_read_the_keys_verls_debug_metrics_read() -> None:
    source = inspect.getsource(calculate_debug_metrics)
    for key in ("old_log_probs", "rollout_log_probs", "response_mask"):
        assert f'data.batch["{key}"]' in source
    same = rollout_batch(OLD.clone())
    out = batch_metrics(same.batch["old_log_probs"], same.batch["rollout_log_probs"],
                        same.batch["response_mask"])  # fmt: skip
    assert out == {"bitwise_equal_frac": 1.0, "k3_kl": 0.0}
    assert calculate_debug_metrics(same)["training/rollout_probs_diff_max"] == 0.0
    batch = rollout_batch(ROLLOUT)
    out = batch_metrics(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"],
                        batch.batch["response_mask"])  # fmt: skip
    assert out["bitwise_equal_frac"] == 4 / 5  # the masked-out -1.0 vs -4.0 is not counted
    assert calculate_debug_metrics(batch)["training/rollout_probs_diff_max"] > 0


def test_a_canary_check_from_the_actors_padded_log_probs() -> None:
    batch = rollout_batch(ROLLOUT)
    monitor = CanaryMonitor()
    check = check_canary(
        monitor, 0, batch.batch["old_log_probs"], [[-1.0, -2.0, -0.75], [-0.5, -3.0]],
        batch.batch["response_mask"],
    )  # fmt: skip
    assert check.bitwise_equal_frac == 4 / 5 and check.in_band


@pytest.mark.parametrize(("vllm", "carried"), [("0.33.0", True), ("0.10.1", False)])
def test_batch_invariant_reaches_the_ray_workers_env_through_verls_merge(vllm, carried) -> None:
    policy = PrecisionPolicy.from_dict({"batch_invariant": "on"})
    cfg = compose_verl(overrides(policy, vllm_version=vllm, gpu_capability=None))
    # verl's main_ppo.run_ppo: OmegaConf.merge(get_ppo_ray_runtime_env(...), ray_init.runtime_env)
    takes_config = "config" in inspect.signature(get_ppo_ray_runtime_env).parameters
    default = get_ppo_ray_runtime_env(cfg) if takes_config else get_ppo_ray_runtime_env()
    merged = OmegaConf.to_container(OmegaConf.merge(default, cfg.ray_kwargs.ray_init.runtime_env))
    env = merged["env_vars"]
    assert all(isinstance(v, str) for v in env.values())  # Ray takes strings only
    # verl 0.9.1's own defaults pin VLLM_BATCH_INVARIANT="0" for its workers: the override
    # must win the merge; without it (an older vLLM) verl's own value stands
    own = OmegaConf.to_container(OmegaConf.create(default)).get("env_vars", {})
    want = "1" if carried else own.get("VLLM_BATCH_INVARIANT")
    assert env.get("VLLM_BATCH_INVARIANT") == want
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": env["PRECISION_PLUGIN"]}) == policy
