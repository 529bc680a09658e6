"""Supervised pretraining of the sanity model to partial accuracy, in float32, deterministic.

The paper's sanity set holds problems the model already solves part of the time, so that a
correct RL pipeline has room to climb toward 100%. Here the model is trained on freshly drawn
task strings (answer tokens only in the loss) and stopped as soon as its sampled accuracy
(temperature 1, what GRPO sees) on the RL problem set reaches ``target``: a start in the
20-80% band.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from precision_plugin.sanity.task import Problem, Task

#: ``progress(description, completed, total)``.
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PretrainSettings:
    """How to pretrain: optimizer, batch, when to measure and when to stop."""

    target: float = 0.4
    max_steps: int = 1500
    eval_every: int = 25
    batch_size: int = 64
    learning_rate: float = 3e-3


@dataclass(frozen=True)
class PretrainReport:
    """What pretraining did: steps, final loss and the sampled accuracy it stopped at."""

    steps: int
    loss: float
    accuracy: float
    reached_target: bool


def sampled_accuracy(
    model: Any, task: Task, tokenizer: Any, problems: Sequence[Problem], seed: int
) -> float:
    """Share of ``problems`` answered exactly by one float32 sample each, at temperature 1."""
    from precision_plugin._core.hf_engine import HFRolloutEngine

    engine = HFRolloutEngine(model, "float32", "cpu")
    prompts = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    samples = engine.generate(prompts, task.max_completion_tokens, seed)
    engine.close()
    texts = tokenizer.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
    return sum(task.score(p.prompt, t) for p, t in zip(problems, texts, strict=True)) / len(
        problems
    )


def _batch(
    task: Task, tokenizer: Any, rng: random.Random, settings: PretrainSettings
) -> tuple[Any, Any]:
    import torch

    rows, labels = [], []
    for _ in range(settings.batch_size):
        problem = task.make_problem(task.draw(rng))
        prompt = tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]
        answer = tokenizer(task.sample_answer(problem.prompt, rng), add_special_tokens=False)
        answer = answer["input_ids"]
        if task.ends_with_eos:
            answer = [*answer, tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    target = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, target


def pretrain(
    model: Any,
    task: Task,
    tokenizer: Any,
    problems: Sequence[Problem],
    seed: int,
    settings: PretrainSettings = PretrainSettings(),
    progress: ProgressFn | None = None,
) -> PretrainReport:
    """Train ``model`` in place until its sampled accuracy on ``problems`` reaches the target.

    Deterministic for a given ``seed`` on a given machine (private data RNG, seeded torch).
    """
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    accuracy, loss_value, step = 0.0, float("nan"), 0
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(1, settings.max_steps + 1):
            ids, labels = _batch(task, tokenizer, rng, settings)
            mask = (ids != tokenizer.pad_token_id).long()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_value = float(loss.detach())
            if progress is not None:
                progress("pretraining (float32)", step, settings.max_steps)
            if step % settings.eval_every == 0:
                model.eval()
                accuracy = sampled_accuracy(model, task, tokenizer, problems, seed + step)
                model.train()
                if accuracy >= settings.target:
                    break
    model.eval()
    return PretrainReport(
        steps=step,
        loss=loss_value,
        accuracy=accuracy,
        reached_target=accuracy >= settings.target,
    )
