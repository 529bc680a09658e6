"""An independent, row-by-row reading of vLLM's sampler, for tests that pin the rollout's
sampling and log-probs to exact values.

Written from vLLM 0.33.0's source, one row and one step at a time with plain Python sets, not
from ``precision_plugin._core.sampling``: penalties (``model_executor/layers/utils.py``
``apply_penalties``, ``_custom_ops.apply_repetition_penalties_torch``), temperature
(``v1/sample/sampler.py`` ``apply_temperature``), min-p (``v1/sample/logits_processor/builtin.py``
``MinPLogitsProcessor.apply``), top-k/top-p (``v1/sample/ops/topk_topp_sampler.py``
``apply_top_k_top_p_pytorch``). The arithmetic is vLLM's (float32, a positive logit times
``1/penalty``), since "exactly as vLLM" is the point.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch


def processed_logits(
    logits: torch.Tensor,
    prompt: Sequence[int],
    output: Sequence[int],
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    stop: Sequence[int] = (),
) -> torch.Tensor:
    """One row's logits (``[vocab]``) as vLLM processes them before sampling (float32)."""
    f32 = torch.float32
    row = logits.detach().to(f32).clone()
    vocab = row.numel()
    for token in stop:  # min-tokens: stop tokens out before anything else
        row[token] = -math.inf
    counts = Counter(output)
    if repetition_penalty != 1.0 or frequency_penalty or presence_penalty:
        penalty = torch.tensor(repetition_penalty, dtype=f32)
        inverse = torch.tensor(1.0, dtype=f32) / penalty
        for token in set(prompt) | set(output):
            row[token] = row[token] * (inverse if row[token] > 0 else penalty)
        for token, count in counts.items():
            row[token] = row[token] - torch.tensor(frequency_penalty, dtype=f32) * count
            row[token] = row[token] - torch.tensor(presence_penalty, dtype=f32)
    row = row / torch.tensor(temperature, dtype=f32)
    if min_p > 0:
        probs = torch.softmax(row, dim=-1)
        floor = probs.max() * torch.tensor(min_p, dtype=f32)
        row = torch.where(probs < floor, torch.tensor(-math.inf), row)
    if 0 < top_k < vocab:
        kth = torch.sort(row, descending=True).values[top_k - 1]
        row = torch.where(row < kth, torch.tensor(-math.inf), row)
    if top_p < 1.0:
        order = torch.sort(row, descending=False)
        mass = torch.softmax(order.values, dim=-1).cumsum(dim=-1)
        threshold = 1 - torch.tensor(top_p, dtype=f32)
        for position in range(vocab - 1):  # the largest always stays
            if mass[position] <= threshold:
                row[order.indices[position]] = -math.inf
    return row


def logprob(row: torch.Tensor, token: int) -> float:
    """log_softmax in float32 of ``row``, at ``token``."""
    return float(torch.log_softmax(row.to(torch.float32), dim=-1)[token])
