"""The asked-vs-ran audit's judgement: each contradiction named with both sides."""

from __future__ import annotations

from types import SimpleNamespace

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


def test_a_rollout_in_the_policy_dtype_still_contradicts_a_learner_that_ran_another():
    found = contradictions(
        PrecisionPolicy(), _learner(forward_dtype="bfloat16"), {"engine": "HFRollout",
                                                                 "dtype": "float16"}
    )  # fmt: skip
    assert found == {
        "forward": "learner: the training forward ran in bfloat16, the policy is float16",
        "rollout": "rollout: HFRollout runs float16 while the learner runs bfloat16 "
        "(policy float16)",
    }


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


# -- "ran" is read from what runs, not from what was asked ---------------------------------------
def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)  # fmt: skip


def _hfrollout(dtype: str, built: bool = True):
    from precision_plugin._core.hf_engine import HFRolloutEngine
    from precision_plugin.trl import HFRollout

    rollout = HFRollout(dtype=dtype)
    if built:  # what its first call does: an inference copy of the learner in its dtype
        rollout.engine = HFRolloutEngine(_tiny_llama(), dtype, "cpu")
    return rollout


def test_hfrollout_side_reads_its_copy_as_it_runs():
    rollout = _hfrollout("float16")
    params = sum(p.numel() for p in rollout.engine.model.parameters())
    result = audit_run(PrecisionPolicy(), None, SimpleNamespace(rollout_func=rollout),
                       forward_dtype=torch.float16)  # fmt: skip
    assert result["rollout"] == {
        "engine": "HFRollout",
        "asked": "float16",
        "dtype": "float16",
        "params": {"float16": params},
        "float32_buffers": {"float32": 8},  # inv_freq and original_inv_freq, 4 each
    }
    assert result["consistent"]


def test_a_copy_that_differs_from_its_request_is_a_contradiction():
    """HFRollout asked for float16, but its copy is float32 (the planted bug "the rollout copy
    built in float32"): the audit reads the copy and sees it."""
    rollout = _hfrollout("float16")
    rollout.engine.model.float()
    trainer = SimpleNamespace(rollout_func=rollout)
    result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)
    assert result["rollout"]["asked"] == "float16" and result["rollout"]["dtype"] == "float32"
    assert result["contradictions"] == {
        "rollout": "rollout: HFRollout runs float32 while the learner runs float16 (policy float16)"
    }
    rollout.engine.model.half()  # every buffer rounded too: a plain .to(float16)
    result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)
    assert set(result["contradictions"]) == {"rollout_buffers"}
    assert "in ['float16']" in result["contradictions"]["rollout_buffers"]


def test_a_copy_with_a_few_float32_weights_runs_the_dtype_most_weights_have():
    rollout = _hfrollout("float16")
    model = rollout.engine.model
    model.lm_head.float()  # 32 x 16 weights left in float32
    total = sum(p.numel() for p in model.parameters())
    result = audit_run(PrecisionPolicy(), None, SimpleNamespace(rollout_func=rollout),
                       forward_dtype=torch.float16)  # fmt: skip
    assert result["rollout"]["params"] == {"float16": total - 512, "float32": 512}
    assert result["rollout"]["dtype"] == "float16" and result["consistent"]


def test_before_the_first_rollout_the_request_is_audited_as_a_request():
    trainer = SimpleNamespace(rollout_func=_hfrollout("bfloat16", built=False))
    result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)
    assert result["rollout"]["dtype"] is None and "not built yet" in result["rollout"]["state"]
    assert result["contradictions"]["rollout"] == (
        "rollout: HFRollout is asked to run bfloat16 while the learner runs float16 "
        "(policy float16)"
    )


class _VllmModelConfig:
    """vLLM's ModelConfig: the resolved dtype is ``dtype`` (a torch.dtype)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _VllmLLMEngine:
    """vLLM 0.33 ``v1/engine/llm_engine.py`` lines 69-70."""

    def __init__(self, model_config: _VllmModelConfig) -> None:
        self.vllm_config = SimpleNamespace(model_config=model_config)
        self.model_config = model_config


class _VllmLLM:
    """vLLM 0.33 ``entrypoints/llm.py`` lines 341-344 (TRL 1.16 keeps it as
    ``trainer.vllm_generation.llm``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.llm_engine = _VllmLLMEngine(_VllmModelConfig(dtype))
        self.model_config = self.llm_engine.model_config


def test_colocated_vllm_is_audited_from_its_model_config():
    trainer = SimpleNamespace(
        use_vllm=True,
        rollout_func=None,
        args=SimpleNamespace(vllm_mode="colocate"),
        vllm_generation=SimpleNamespace(llm=_VllmLLM(torch.bfloat16)),
    )
    result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)
    assert result["rollout"] == {"engine": "vLLM (colocate)", "dtype": "bfloat16"}
    assert result["contradictions"]["rollout"] == (
        "rollout: vLLM (colocate) runs bfloat16 while the learner runs float16 (policy float16)"
    )
    trainer.vllm_generation.llm = _VllmLLM(torch.float16)
    assert audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)["consistent"]


def test_a_vllm_server_is_audited_from_its_answer():
    """TRL's own VLLMClient.get_server_info against a loopback /server_info."""
    import json

    import requests
    from trl.generation.vllm_client import VLLMClient

    from tests.loopback import Answer, loopback

    body = json.dumps({"vllm_config": {"model_config": {"dtype": "torch.bfloat16"}}}).encode()
    with loopback(Answer("/server_info?config_format=json", body)) as server:
        client = VLLMClient.__new__(VLLMClient)  # its __init__ needs vLLM installed
        client.session, client.base_url = requests.Session(), server.url
        trainer = SimpleNamespace(
            use_vllm=True,
            rollout_func=None,
            args=SimpleNamespace(vllm_mode="server"),
            vllm_generation=SimpleNamespace(vllm_client=client),
        )
        result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)
    assert result["rollout"] == {"engine": f"vLLM server at {server.url}", "dtype": "bfloat16"}
    assert "runs bfloat16 while the learner runs float16" in result["contradictions"]["rollout"]


def test_a_rollout_on_the_policy_beside_an_fp32_learner_points_at_the_learner():
    """fp16 asked on a CPU without enable(): the learner silently runs float32 and HFRollout
    follows the policy. The fix names the learner, not "HFRollout(dtype=...) or no dtype",
    which the user already did."""
    from precision_plugin.audit import FIXES, fix_of

    trainer = SimpleNamespace(rollout_func=_hfrollout("float16", built=False))
    result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float32)
    assert set(result["contradictions"]) == {"forward", "rollout"}
    assert fix_of("rollout", result, PrecisionPolicy()) == (
        "the rollout already runs the policy's float16; the learner does not (its forward ran in "
        "float32): call precision_plugin.enable() before building the trainer"
    )
    # A rollout off the policy keeps its own fix.
    trainer = SimpleNamespace(rollout_func=_hfrollout("bfloat16", built=False))
    result = audit_run(PrecisionPolicy(), None, trainer, forward_dtype=torch.float16)
    assert fix_of("rollout", result, PrecisionPolicy()) == FIXES["rollout"]
