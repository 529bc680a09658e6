"""``torch.multinomial(p, 1, generator=g)`` on CPU: the same token, drawn in fewer passes.

PyTorch draws one sample from ``p`` as ``argmax(p / q)`` with ``q ~ Exp(1)`` for every entry
(``aten/src/ATen/native/Distributions.cpp``, the Gumbel trick). On CPU each ``q`` comes from a
serial loop: two 32-bit outputs of the generator's Mersenne Twister make a 53-bit uniform
``u``, and ``q = float32(-log1p(-u))`` in double precision (MKL's vectorised path is disabled,
pytorch#132395). Over a 49,152-token vocabulary that loop took about 1.1 ms per row and step,
about a tenth of a SmolLM2-135M decode step.

:class:`Multinomial` draws the same numbers faster: NumPy's ``MT19937`` (the same algorithm),
given each generator's state, yields the same 32-bit outputs from a C loop; the uniforms
``u`` follow with two array operations. Since ``-log1p(-u) >= u``, ``p / u`` bounds every
ratio from above, so PyTorch's exact ratio (``log1p`` from the C library, as PyTorch calls
it, then float32 rounding and division) is computed only for the few entries whose bound
reaches the largest exact ratio found; among them the largest wins, the first on a tie, as
``argmax`` picks. The token is the one ``torch.multinomial`` returns and each generator ends
in the state ``torch.multinomial`` leaves (tests/unit/test_multinomial_cpu.py compares both).
Anything else runs ``torch.multinomial`` itself: another device or dtype, a generator whose
state is not the CPU layout, or a row that is not a distribution (so PyTorch's own error is
raised).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

__all__ = ["Multinomial", "exact_draw"]

#: Mersenne Twister state words (PyTorch's ``at::mt19937`` and NumPy's ``MT19937``).
_WORDS = 624
#: Byte offsets in PyTorch's CPU generator state (``CPUGeneratorImplStateLegacy``): the
#: remaining-outputs counter ``left_`` (int32), the next index ``next_`` (uint64) and the state.
_LEFT, _NEXT, _STATE = 8, 16, 24
#: A 53-bit uniform from 64 random bits: the low 53 bits times 2**-53 (``uniform_real``).
_LOW_BITS = (1 << 53) - 1
_UNIT = 2.0**-53
#: Relative room between a ratio's bound and the exact ratios: the bound exceeds the exact
#: float32 ratio by at most three roundings (about 2e-7), far inside it.
_ROOM = 1e-5


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # NumPy is optional for torch: torch.multinomial then
        return None
    return numpy


def _to_numpy(generator: Any, np: Any) -> Any | None:
    """A NumPy ``MT19937`` in ``generator``'s state; ``None`` if the state is not a CPU
    generator's."""
    try:
        raw = generator.get_state().numpy().tobytes()
    except Exception:  # a generator of another device
        return None
    if len(raw) < _STATE + 8 * _WORDS:
        return None
    (left,) = struct.unpack_from("<i", raw, _LEFT)
    key = np.frombuffer(raw, dtype="<u8", count=_WORDS, offset=_STATE).astype(np.uint32)
    twister = np.random.MT19937()
    # PyTorch counts down the outputs left before the next twist; NumPy counts up its position.
    twister.state = {
        "bit_generator": "MT19937",
        "state": {"key": key, "pos": _WORDS + 1 - left},
    }
    return twister


def _write_back(twister: Any, generator: Any, np: Any) -> None:
    """Put ``twister``'s state into ``generator`` (its other fields as they were)."""
    import torch

    raw = bytearray(generator.get_state().numpy().tobytes())
    state = twister.state["state"]
    position = int(state["pos"])
    struct.pack_into("<i", raw, _LEFT, _WORDS + 1 - position)
    struct.pack_into("<Q", raw, _NEXT, position)
    raw[_STATE : _STATE + 8 * _WORDS] = state["key"].astype("<u8").tobytes()
    generator.set_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


def _uniforms(twister: Any, count: int, np: Any) -> Any:
    """``count`` 53-bit uniforms in [0, 1) as PyTorch's CPU generator makes them: 64 bits from
    two 32-bit outputs (the first high), the low 53 bits times 2**-53."""
    # NumPy's full-range 64-bit integers are next_uint64: first output high, second low.
    bits = np.random.Generator(twister).integers(0, 2**64, size=count, dtype=np.uint64)
    bits &= np.uint64(_LOW_BITS)
    return bits * _UNIT


def _ratio(p: float, u: float, np: Any) -> float:
    """PyTorch's ``p / q`` for one entry: ``q = float32(-log1p(-u))``, divided in float32."""
    q = np.float32(-math.log1p(-u))
    return float(np.float32(p) / q)


def exact_draw(p: Any, u: Any, np: Any) -> int:
    """``argmax(p / q)`` over every entry, computed as PyTorch does (NaN counts as largest, the
    first of equal values wins): the reference the bounded draw must equal."""
    q = np.array([-math.log1p(-x) for x in u.tolist()], dtype=np.float64).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return int(np.argmax(p.astype(np.float32) / q))


def _draw(p: Any, twister: Any, np: Any) -> int:
    """One token from ``p`` (a float32 NumPy row) with ``twister``'s next uniforms."""
    u = _uniforms(twister, p.shape[0], np)
    if not u.all():  # a uniform of exactly 0 (odds 2**-53 each): PyTorch's q is -0
        return exact_draw(p, u, np)
    bound = p / u
    first = int(bound.argmax())
    best = _ratio(p[first], u[first], np)
    pick = first
    for index in np.flatnonzero(bound >= best * (1 - _ROOM)).tolist():
        ratio = _ratio(p[index], u[index], np)
        if ratio > best or (ratio == best and index < pick):
            best, pick = ratio, index
    return pick


class Multinomial:
    """One sample per row, as ``torch.multinomial(probs[row], 1, generator=...)`` draws it.

    ``generators``: one ``torch.Generator`` per sequence. Each call of ``sample`` advances the
    generators of the rows it draws for; ``close`` leaves every generator in the state
    ``torch.multinomial`` would have left.
    """

    def __init__(self, generators: Sequence[Any]) -> None:
        self._generators = list(generators)
        self._np = _numpy()
        self._twisters: list[Any] = [None] * len(self._generators)
        self._loaded = [False] * len(self._generators)

    def _twister(self, index: int) -> Any | None:
        if not self._loaded[index]:
            self._loaded[index] = True
            if self._np is not None:
                self._twisters[index] = _to_numpy(self._generators[index], self._np)
        return self._twisters[index]

    def sample(self, probs: Any, sequences: Sequence[int]) -> Any:
        """One token per row of ``probs`` (``[rows, vocab]``), row ``i`` drawn with generator
        ``sequences[i]``; returns a ``[rows]`` long tensor."""
        import torch

        fast = probs.device.type == "cpu" and probs.dtype == torch.float32
        values = probs.detach().contiguous().numpy() if fast else None
        tokens = []
        for row, index in enumerate(int(i) for i in sequences):
            twister = self._twister(index) if fast else None
            p = values[row] if values is not None else None
            if twister is None or not _is_distribution(p):
                self._release(index)
                draw = torch.multinomial(probs[row], 1, generator=self._generators[index])
                tokens.append(int(draw))
                continue
            tokens.append(_draw(p, twister, self._np))
        return torch.tensor(tokens, dtype=torch.long, device=probs.device)

    def _release(self, index: int) -> None:
        """Hand generator ``index`` back to PyTorch (its state written back, read again on the
        next fast draw)."""
        twister = self._twisters[index]
        if twister is not None:
            _write_back(twister, self._generators[index], self._np)
        self._twisters[index] = None
        self._loaded[index] = False

    def close(self) -> None:
        """Write every generator's state back (the state ``torch.multinomial`` leaves)."""
        for index in range(len(self._generators)):
            self._release(index)


def _is_distribution(p: Any) -> bool:
    """Whether ``p`` is what ``torch.multinomial`` accepts: finite, non-negative, some mass."""
    total = float(p.sum())
    return math.isfinite(total) and total > 0 and float(p.min()) >= 0
