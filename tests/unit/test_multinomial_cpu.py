"""multinomial_cpu.Multinomial draws torch.multinomial's own token from its own generator state
and leaves each generator where torch.multinomial leaves it; whatever it cannot draw that way
(another dtype, not a distribution) is torch.multinomial itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from precision_plugin._core.scoring import multinomial_cpu
from precision_plugin._core.scoring.multinomial_cpu import Multinomial, exact_draw


def _distributions(vocab: int, seed: int) -> list[torch.Tensor]:
    """Flat, peaked, very peaked, top-k-like (most entries exactly 0) and one-hot rows."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for scale in (0.5, 3.0, 30.0):
        rows.append((torch.randn(vocab, generator=g) * scale).softmax(-1))
    kept = torch.randn(vocab, generator=g)
    kept[torch.randperm(vocab, generator=g)[: vocab - 5]] = -float("inf")
    rows.append(kept.softmax(-1))
    one = torch.zeros(vocab)
    one[vocab // 3] = 1.0
    rows.append(one)
    return rows


@pytest.mark.parametrize("vocab", [7, 1000, 49152])
def test_tokens_and_generator_states_are_torch_multinomials(vocab: int) -> None:
    """12 sequences x 5 distributions x 4 steps: every token and, after close(), every
    generator state equal torch.multinomial's (seeds far apart, including 0 and 2**40)."""
    seeds = [0, 1, 17, 2**31 - 1, 2**40 + 3, *range(100, 107)]
    rows = _distributions(vocab, seed=vocab)
    ours = [torch.Generator().manual_seed(s) for s in seeds]
    theirs = [torch.Generator().manual_seed(s) for s in seeds]
    draws = Multinomial(ours)
    for step in range(4):
        probs = torch.stack([rows[(i + step) % len(rows)] for i in range(len(seeds))])
        expected = [
            int(torch.multinomial(probs[i], 1, generator=theirs[i])) for i in range(len(seeds))
        ]
        assert draws.sample(probs, list(range(len(seeds)))).tolist() == expected
    draws.close()
    for mine, reference in zip(ours, theirs, strict=True):
        assert torch.equal(mine.get_state(), reference.get_state())


def test_rows_draw_with_the_generator_of_their_sequence() -> None:
    """Rows that left the batch take their generators with them: row i uses sequences[i]."""
    probs = torch.randn(3, 500, generator=torch.Generator().manual_seed(4)).softmax(-1)
    ours = [torch.Generator().manual_seed(s) for s in range(5)]
    theirs = [torch.Generator().manual_seed(s) for s in range(5)]
    draws = Multinomial(ours)
    got = draws.sample(probs, [4, 0, 2]).tolist()
    expected = [
        int(torch.multinomial(probs[row], 1, generator=theirs[s]))
        for row, s in enumerate([4, 0, 2])
    ]
    assert got == expected
    draws.close()
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs, strict=True))


def test_rows_drawn_inside_inference_mode() -> None:
    """The rollout loop draws inside torch.inference_mode()."""
    probs = torch.randn(2, 300, generator=torch.Generator().manual_seed(9)).softmax(-1)
    with torch.inference_mode():
        probs = probs.clone()
        got = Multinomial([torch.Generator().manual_seed(s) for s in (5, 6)]).sample(probs, [0, 1])
    expected = [
        int(torch.multinomial(probs[i], 1, generator=torch.Generator().manual_seed(s)))
        for i, s in enumerate((5, 6))
    ]
    assert got.tolist() == expected


def test_a_row_that_is_no_distribution_raises_torchs_own_error() -> None:
    probs = torch.tensor([[0.5, float("nan"), 0.5]])
    with pytest.raises(RuntimeError) as ours:
        Multinomial([torch.Generator().manual_seed(0)]).sample(probs, [0])
    with pytest.raises(RuntimeError) as theirs:
        torch.multinomial(probs[0], 1, generator=torch.Generator().manual_seed(0))
    assert str(ours.value) == str(theirs.value)


def test_another_dtype_is_torch_multinomial() -> None:
    """float64 rows run torch.multinomial (its kernel, its generator state)."""
    probs = torch.randn(2, 50, generator=torch.Generator().manual_seed(1)).softmax(-1).double()
    ours = [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    got = Multinomial(ours).sample(probs, [0, 1]).tolist()
    theirs = [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    assert got == [int(torch.multinomial(probs[i], 1, generator=theirs[i])) for i in (0, 1)]
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs, strict=True))


def test_the_bounded_draw_equals_the_exact_one_with_ties_and_a_zero_uniform(monkeypatch) -> None:
    """_draw computes exact ratios only near the bound's maximum; planted uniforms make ties
    (the first index wins, as argmax picks) and a uniform of exactly 0 (PyTorch's q is -0:
    a zero-probability entry gives NaN, which argmax takes as the largest)."""
    p = np.array([0.1, 0.3, 0.0, 0.3, 0.3], dtype=np.float32)
    cases = {
        "tie": np.array([0.5, 0.25, 0.75, 0.25, 0.25]),
        "nan": np.array([0.5, 0.25, 0.0, 0.5, 0.9]),
        "one": np.array([0.01, 0.9, 0.9, 0.8, 0.7]),
    }
    expected = {"tie": 1, "nan": 2, "one": 0}
    for name, uniforms in cases.items():
        monkeypatch.setattr(multinomial_cpu, "_uniforms", lambda *_, u=uniforms: u.copy())
        assert multinomial_cpu._draw(p, None, np) == expected[name], name
        assert exact_draw(p, uniforms, np) == expected[name], name


def test_the_bounded_draw_equals_the_exact_one_on_random_rows() -> None:
    """2,000 random rows (vocabulary 64, some entries 0): the bound never hides the winner."""
    rng = np.random.default_rng(7)
    for _ in range(2000):
        p = rng.dirichlet(np.full(64, rng.choice([0.05, 1.0, 20.0]))).astype(np.float32)
        p[rng.random(64) < 0.2] = 0
        seed = int(rng.integers(2**32))
        u = multinomial_cpu._uniforms(np.random.MT19937(seed), 64, np)
        assert multinomial_cpu._draw(p, np.random.MT19937(seed), np) == exact_draw(p, u, np)
