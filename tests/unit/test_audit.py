"""The asked-vs-ran audit's judgement: each contradiction named with both sides."""

from __future__ import annotations

import torch

from precision_plugin import PrecisionPolicy
from precision_plugin.audit import audit_run, contradictions, render


def _learner(**overrides):
    base = {
        "forward_dtype": "float16",
        "trainable_params": {"float32": 10},
        "loss_scaler": {"class": "GradScaler", "scale": 65536.0},
    }
    return {**base, **overrides}


def test_consistent_sides_have_no_contradiction():
    rollout = {"engine": "HFRollout", "dtype": "float16"}
    assert contradictions(PrecisionPolicy(), _learner(), rollout) == {}


def test_each_contradiction_names_both_sides():
    policy = PrecisionPolicy()
    found = contradictions(
        policy,
        _learner(forward_dtype="float32", trainable_params={"bfloat16": 4, "float32": 6}),
        {"engine": "vLLM (colocate)", "dtype": "bfloat16"},
    )
    assert set(found) == {"forward", "rollout", "trainable"}
    assert "ran in float32" in found["forward"] and "float16" in found["forward"]
    assert "vLLM (colocate) runs bfloat16" in found["rollout"]
    assert "learner runs float32" in found["rollout"]
    assert "bfloat16" in found["trainable"]


def test_unknown_rollout_dtype_is_not_a_contradiction():
    found = contradictions(PrecisionPolicy(), _learner(), {"engine": "x", "dtype": None})
    assert found == {}


def test_plain_model_without_trainer_audits_parameters_and_renders():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).half())
    model[1].weight.requires_grad_(False)
    result = audit_run(PrecisionPolicy(), None, None, model)
    assert result["learner"]["trainable_params"] == {"float16": 2, "float32": 20}
    assert result["learner"]["frozen_params"] == {"float16": 8}
    assert result["rollout"]["dtype"] is None
    text = render(result, "asked vs ran")
    assert "asked vs ran" in text and "trainable_params" in text
