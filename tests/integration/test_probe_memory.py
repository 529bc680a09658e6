"""The HF rollout engine's memory does not grow with vocabulary x generated tokens.

Measured as tensor bytes held: every tensor an operator creates during ``generate`` is counted
from its creation until it is freed (by storage, so views are not counted twice), and the peak
of that sum is compared at two generation lengths on a large-vocabulary model. An engine that
kept each step's logits (``output_logits=True``) would add batch x vocab x 4 bytes per step.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from precision_plugin._core.hf_engine import HFRolloutEngine


class LiveTensorBytes(TorchDispatchMode):
    """Tracks the bytes of tensors created under it that are still alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in self._live:
                    self._live[key] = size
                    self.current += size
                    weakref.finalize(t, self._release, key)
        self.peak = max(self.peak, self.current)
        return out


def _peak_bytes(engine: HFRolloutEngine, prompts: list[list[int]], steps: int) -> int:
    with LiveTensorBytes() as tracker:
        samples = engine.generate(prompts, steps, 0)
    assert [len(s.completion_ids) for s in samples] == [steps] * len(prompts)  # no EOS
    return tracker.peak


def test_retained_state_does_not_scale_with_vocab_times_steps() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, batch, short, long = 50_000, 2, 16, 64
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=None,  # nothing ends early: both runs generate every step
        bos_token_id=None,
        pad_token_id=0,
    )
    engine = HFRolloutEngine(LlamaForCausalLM(config).eval(), "float32", "cpu")
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    growth = _peak_bytes(engine, prompts, long) - _peak_bytes(engine, prompts, short)
    kept_logits = batch * vocab * 4 * (long - short)  # what keeping every step's logits adds
    # What may grow: the KV cache, the mask and the token/log-prob buffers (a few KiB here).
    assert growth < kept_logits / 20, (growth, kept_logits)
