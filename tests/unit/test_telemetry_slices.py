"""Which of the batches ``GRPOTrainer._compute_loss`` sees the TRL telemetry counts: each new
rollout slice of a training step once (TRL hands the same tensors again when
``num_iterations > 1``), evaluation batches never; figures pinned to hand-computed values."""

from __future__ import annotations

import math
import types

import torch

from precision_plugin import PrecisionPolicy
from precision_plugin.trl import telemetry

MU = [[-0.5, -1.0, -2.0], [-0.3, -0.7, -0.1]]  # rollout log-probs
PI = [[-0.4, -1.2, -2.0], [-0.3, -0.6, -0.5]]  # trainer log-probs (old_per_token_logps)
MASK = [[1, 1, 0], [1, 1, 1]]


def _inputs() -> dict[str, torch.Tensor]:
    return {
        "sampling_per_token_logps": torch.tensor(MU),
        "old_per_token_logps": torch.tensor(PI),
        "completion_mask": torch.tensor(MASK),
    }


def _trainer(training: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(model=types.SimpleNamespace(training=training))


def _original(_self, _model, _inputs) -> torch.Tensor:
    return torch.tensor(2.5)


def _loss(trainer, inputs) -> float:
    return float(telemetry.compute_loss(PrecisionPolicy(), _original, trainer, None, inputs))


def _expected() -> dict[str, float]:
    # the float32 values the tensors hold, in float64 from there on (as the telemetry computes)
    pi, mu = torch.tensor(PI).double().tolist(), torch.tensor(MU).double().tolist()
    d = [p - m for pr, mr, kr in zip(pi, mu, MASK, strict=True)
         for p, m, k in zip(pr, mr, kr, strict=True) if k]  # fmt: skip
    return {
        "tokens": 5.0,
        "k1_kl": -sum(d) / 5,
        "k3_kl": sum(math.expm1(x) - x for x in d) / 5,
        "logp_abs_diff_mean": sum(abs(x) for x in d) / 5,
    }


def _check(metrics: dict[str, float]) -> None:
    for name, value in _expected().items():
        assert math.isclose(metrics[name], value, rel_tol=1e-12, abs_tol=1e-15), name


def test_a_slice_trl_hands_again_is_counted_once():
    trainer, inputs = _trainer(), _inputs()
    assert _loss(trainer, inputs) == 2.5
    assert _loss(trainer, inputs) == 2.5  # the second iteration over the same rollout slice
    _check(telemetry.flush(trainer))
    assert _loss(trainer, _inputs()) == 2.5  # equal values, new tensors: a new slice
    _check(telemetry.flush(trainer))


def test_evaluation_batches_are_not_counted():
    trainer = _trainer(training=False)
    assert _loss(trainer, _inputs()) == 2.5  # the loss is still computed
    assert telemetry.flush(trainer) == {}
    trainer.model.training = True
    assert _loss(trainer, _inputs()) == 2.5
    _check(telemetry.flush(trainer))
