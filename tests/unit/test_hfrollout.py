"""HFRollout's copy and seeds, through a stand-in for the GRPO trainer calling it: what TRL's
rollout_func contract hands it (args, state, accelerator, model, _tokenize_prompts)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from precision_plugin._core.buffers import keeps_float32
from precision_plugin.trl import HFRollout
from tests.unit.test_buffers import _small

BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"


def _deepseek() -> torch.nn.Module:
    """A DeepSeek-V3 learner in float32: RoPE frequencies (non-persistent) and the MoE routing
    bias (a persistent buffer, so in the state dict HFRollout refreshes from)."""
    return _small(
        "DeepseekV3Config", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    )  # fmt: skip


def _trainer(model: torch.nn.Module, process: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        args=SimpleNamespace(seed=0, max_completion_length=12, generation_kwargs=None),
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(device="cpu", process_index=process, unwrap_model=lambda m: m),
        model=model,
        _tokenize_prompts=lambda prompts: (prompts,),  # the prompts are token ids already
    )


def test_a_refresh_copies_the_stepped_learner_and_keeps_float32_buffers_exact():
    learner = _deepseek()
    trainer = _trainer(learner)
    rollout = HFRollout("bfloat16")
    rollout._sync(trainer)
    # an optimizer step: every weight moves, and the routing bias by steps bf16 cannot hold
    with torch.no_grad():
        for param in learner.parameters():
            param.add_(0.01)
        dict(learner.named_buffers())[BIAS].copy_(torch.tensor([5.001, 5.002, 5.003, 5.004]))
    trainer.state.global_step = 1
    rollout._sync(trainer)
    assert rollout.syncs == 2 and rollout.synced_step == 1
    source = {**dict(learner.named_parameters()), **dict(learner.named_buffers())}
    copy_ = {**dict(rollout.engine.model.named_parameters()),
             **dict(rollout.engine.model.named_buffers())}  # fmt: skip
    assert set(copy_) == set(source)
    for name, tensor in copy_.items():
        if keeps_float32(name):
            assert tensor.dtype == torch.float32 and torch.equal(tensor, source[name]), name
        else:
            assert torch.equal(tensor, source[name].to(torch.bfloat16)), name
    assert copy_[BIAS].unique().numel() == 4  # rounded to bf16 the four would be one


def _completions(process: int) -> list[list[int]]:
    from tests.unit.test_sampling import _model

    rollout = HFRollout("float32")
    out = rollout([[1, 5, 9], [1, 5, 9], [1, 7]], _trainer(_model(), process))
    return out["completion_ids"]


def test_each_process_samples_its_own_completions():
    """GRPO spreads a prompt's generations over the processes: two processes must not draw the
    same completions for the same prompt (identical completions carry no advantage). Within one
    process the same call is reproducible."""
    first = _completions(0)
    assert _completions(0) == first
    second = _completions(1)
    assert all(a != b for a, b in zip(first, second, strict=True))
    assert first[0] != first[1]  # the same prompt twice in one call: one seed per row
