"""The sanity benchmark trains every dtype from the pretrained weights, never from the weights the
previous dtype's run left behind: each GRPO run starts bit-equal to the model pretraining made."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from precision_plugin.sanity import run as sanity_run
from precision_plugin.sanity.schema import preset_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_accelerator_state")]


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def test_every_dtype_starts_from_the_pretrained_weights(monkeypatch):
    from trl import GRPOTrainer

    pretrained: list[dict[str, torch.Tensor]] = []  # after each pretraining
    runs: list[tuple[int, dict, dict]] = []  # (pretrainings so far, start, end) per GRPO run
    real_pretrain, real_train = sanity_run.pretrain, GRPOTrainer.train

    def spy_pretrain(model, *args, **kwargs):
        report = real_pretrain(model, *args, **kwargs)
        pretrained.append(_weights(model))
        return report

    def spy_train(self, *args, **kwargs):
        start = _weights(self.model)
        result = real_train(self, *args, **kwargs)
        runs.append((len(pretrained), start, _weights(self.model)))
        return result

    monkeypatch.setattr(sanity_run, "pretrain", spy_pretrain)
    monkeypatch.setattr(GRPOTrainer, "train", spy_train)
    config = preset_config("default", smoke=True, steps=2, dtypes=("float16", "bfloat16"))
    sanity_run.run_sanity(config)

    assert pretrained and len(runs) >= 2
    for seen, start, end in runs:
        reference = pretrained[seen - 1]  # the pretraining this run follows
        assert start.keys() == reference.keys()
        assert all(torch.equal(start[k], reference[k]) for k in reference)
        assert any(not torch.equal(end[k], start[k]) for k in start)  # and it did train
