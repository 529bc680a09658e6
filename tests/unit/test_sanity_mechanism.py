"""The gradient-cosine readout: the corrected surrogate's gradient, the cosine, and what it
records on a real TRL ``GRPOTrainer``, each against an independent computation in the test."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from precision_plugin.errors import PrecisionConfigError  # noqa: E402
from precision_plugin.sanity.mechanism import (  # noqa: E402
    COSINE_KEY,
    SEQ_RATIO_KEY,
    GradCosineReadout,
    corrected_surrogate,
    cosine,
)

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([0.5, -1.0])
ROLLOUT = torch.tensor([[-0.5, -1.0, -0.25], [-2.0, -0.5, -9.0]])
LOGPS = torch.tensor([[-0.25, -1.0, -0.5], [-1.5, -0.25, -3.0]])


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "dr_grpo", "grpo"])
def test_corrected_surrogate_gradient_is_the_weighted_policy_gradient(loss_type):
    logps = LOGPS.clone().requires_grad_(True)
    surrogate, seq = corrected_surrogate(logps, ROLLOUT, ADV, MASK, loss_type)
    # log w = sum over unmasked tokens of (log pi - log mu): 0.25 + 0 - 0.25; 0.5 + 0.25
    assert seq.tolist() == [0.0, 0.75]
    w = [1.0, math.exp(0.75)]
    surrogate.backward()
    normalizer = {"dapo": 5.0, "bnpo": 5.0, "dr_grpo": 6.0}.get(loss_type)
    for i in range(2):
        for t in range(3):
            m = MASK[i, t].item()
            denom = normalizer if normalizer else 2.0 * MASK[i].sum().item()
            assert logps.grad[i, t].item() == pytest.approx(-w[i] * ADV[i].item() * m / denom)


def test_corrected_surrogate_refuses_a_loss_it_cannot_rebuild():
    with pytest.raises(PrecisionConfigError, match="sapo"):
        corrected_surrogate(LOGPS, ROLLOUT, ADV, MASK, "sapo")


def test_cosine_of_gradients_given_as_tensor_lists():
    a = [torch.tensor([1.0, 0.0]), torch.tensor([[0.0]])]
    b = [torch.tensor([1.0, 1.0]), torch.tensor([[0.0]])]
    assert cosine(a, b) == pytest.approx(1 / math.sqrt(2), abs=1e-15)
    assert math.isnan(cosine(a, [torch.zeros(2), torch.zeros(1, 1)]))
    assert math.isnan(cosine(a, [torch.tensor([math.inf, 0.0]), torch.zeros(1, 1)]))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from precision_plugin.sanity.model import build_model
    from precision_plugin.sanity.task import REVERSE

    model, tokenizer = build_model("tiny", seed=3)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        loss_type="dapo",
        beta=0.0,
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL's default on CPU is bfloat16 autocast; this test is float32
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=REVERSE.reward_function(),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["abc>"] * 4}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _inputs():
    prompt = torch.tensor([[3, 4, 5, 9]] * 4)  # "abc>"
    completion = torch.tensor([[5, 4, 3, 2], [5, 3, 2, 0], [4, 4, 3, 2], [8, 7, 2, 0]])
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "num_items_in_batch": completion_mask.sum(),
    }


def _independent(model, inputs, rollout):
    """Plain and importance-weighted policy gradients, computed here from a plain forward."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, inputs["completion_ids"][..., None])
    logp = logp.squeeze(-1)
    m = inputs["completion_mask"].float()
    seq = ((logp.detach() - rollout) * m).sum(-1)
    params = [p for p in model.parameters() if p.requires_grad]
    adv = inputs["advantages"][:, None]
    plain = torch.autograd.grad(-(adv * logp * m).sum(), params, retain_graph=True)
    weighted = torch.autograd.grad(-(seq.exp()[:, None] * adv * logp * m).sum(), params)
    return cosine(list(plain), list(weighted)), float(seq.abs().mean())


def _pre_optimizer_step(trainer):
    trainer.callback_handler.on_pre_optimizer_step(trainer.args, trainer.state, trainer.control)


def test_trainer_records_the_cosine_of_its_gradient_with_the_corrected_one(trainer):
    readout = GradCosineReadout().attach(trainer)
    model = trainer.model
    model.train()
    inputs = _inputs()
    with torch.no_grad():  # the rollout's log-probs: the trainer's, moved by known offsets
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        logits = model(input_ids=ids).logits[:, -5:-1]
        logp = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"][..., None])
    offsets = torch.tensor([0.3, -0.2, 0.0, 0.4])[:, None]
    rollout = (logp.squeeze(-1) + offsets) * inputs["completion_mask"]
    inputs["sampling_per_token_logps"] = rollout
    expected_cos, expected_ratio = _independent(model, inputs, rollout)
    assert expected_cos < 0.95  # the offsets turn the gradient visibly

    trainer._metrics["train"].clear()
    model.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()  # the trainer's own backward: the plain policy gradient in .grad
    _pre_optimizer_step(trainer)
    metrics = trainer._metrics["train"]
    assert metrics[COSINE_KEY] == [pytest.approx(expected_cos, abs=1e-6)]
    assert metrics[SEQ_RATIO_KEY] == [pytest.approx(expected_ratio, rel=1e-5)]
    _pre_optimizer_step(trainer)  # the corrected gradient was used up: nothing more
    assert len(metrics[COSINE_KEY]) == 1

    # detached (and on any other trainer): no extra backward, nothing recorded
    readout.detach()
    assert "_compute_loss" not in vars(trainer)
    trainer._metrics["train"].clear()
    model.zero_grad()
    trainer.compute_loss(model, inputs).backward()
    _pre_optimizer_step(trainer)
    assert COSINE_KEY not in trainer._metrics["train"]
    assert SEQ_RATIO_KEY not in trainer._metrics["train"]
