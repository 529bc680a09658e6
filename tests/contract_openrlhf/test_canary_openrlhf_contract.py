"""The canary's OpenRLHF hook points against real OpenRLHF 0.11.2: the per-batch metrics read an
``Experience``'s ``action_log_probs``/``rollout_log_probs``/``action_mask`` (the fields its
policy loss compares), and ``batch_invariant='on'`` travels in the ``runtime_env`` that
``train()``'s ``ray.init`` would otherwise build (its engine actors set no env of their own)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import openrlhf
import torch
from openrlhf.models.loss import PolicyLoss
from openrlhf.trainer.ppo_utils.experience import Experience

from precision_plugin import openrlhf as orl
from precision_plugin._base.versions import installed_version
from precision_plugin._core.canary import CanaryMonitor
from precision_plugin._core.canary.workers import batch_metrics, check_canary
from precision_plugin.policy import PrecisionPolicy

OLD = torch.tensor([[-1.0, -2.0, -0.25], [-0.5, -3.0, -1.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.75], [-0.5, -3.0, -4.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_batch_metrics_read_the_experience_fields_the_policy_loss_compares() -> None:
    fields = {f.name for f in dataclasses.fields(Experience)}
    assert {"action_log_probs", "rollout_log_probs", "action_mask"} <= fields
    assert "rollout_log_probs" in inspect.signature(PolicyLoss.forward).parameters
    exp = Experience(action_log_probs=OLD, rollout_log_probs=ROLLOUT, action_mask=MASK)
    out = batch_metrics(exp.action_log_probs, exp.rollout_log_probs, exp.action_mask)
    assert out["bitwise_equal_frac"] == 4 / 5
    same = Experience(action_log_probs=OLD, rollout_log_probs=OLD.clone(), action_mask=MASK)
    assert batch_metrics(same.action_log_probs, same.rollout_log_probs, same.action_mask) == {
        "bitwise_equal_frac": 1.0,
        "k3_kl": 0.0,
    }
    check = check_canary(CanaryMonitor(), 0, exp.action_log_probs, exp.rollout_log_probs, MASK)
    assert check.bitwise_equal_frac == 4 / 5 and check.in_band


def test_batch_invariant_travels_in_the_runtime_env() -> None:
    policy = PrecisionPolicy.from_dict({"batch_invariant": "on"})
    env = orl.runtime_env(policy)["env_vars"]
    vllm = installed_version("vllm")
    assert vllm is not None  # the OpenRLHF environment has vLLM (its engine actors' engine)
    assert env.get("VLLM_BATCH_INVARIANT") == ("1" if vllm.release >= (0, 11, 1) else None)
    assert all(isinstance(v, str) for v in env.values())
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": env["PRECISION_PLUGIN"]}) == policy
    package = Path(openrlhf.__file__).parent
    setting = {p.name for p in package.rglob("*.py") if "runtime_env" in p.read_text()}
    assert setting == {"train_ppo_ray.py"}  # only train()'s own ray.init sets one
