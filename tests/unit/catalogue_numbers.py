"""Bad inputs of issue 52, classes 3 to 5: numbers outside their domain that reached scipy, math
or torch; sequences that do not pair up; non-finite values that were certified. Each ends in the
plugin's own error naming the parameter (a rule declared with its type where it can be:
``precision_plugin._base.constraints``, ``boundary.same_length``/``same_rows``), or in the exact
outcome, computed here independently.

Rows for the catalogue of ``tests/unit/test_bad_inputs.py`` (each a ``Case``'s keyword
arguments); ``rows(h)`` takes that module. A call that could allocate without bound or hang
(a billion resamples, a seed past 64 bits) runs in a forked child with a memory cap and a time
limit (``catalogue_files.isolated``), so a regression fails its case instead of the run.
"""

from __future__ import annotations

import importlib
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from precision_plugin import PrecisionConfigError
from tests.unit.catalogue_files import isolated

INF, NAN = math.inf, math.nan
#: Per-sequence log-ratios of two sequences (a bootstrap needs two).
RATIOS = [[0.1, 0.2], [0.3]]


def call(module: str, name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    """``precision_plugin.<module>.<name>(*args, **kw)``."""

    def run(tmp: Path) -> Any:
        return getattr(importlib.import_module(f"precision_plugin.{module}"), name)(*args, **kw)

    return run


def intervals(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    return call("intervals", name, *args, **kw)


def decompose(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    return call("probe.attribution.decompose", name, *args, **kw)


def workers(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    return call("canary.workers", name, *args, **kw)


class Scorer:
    """A scorer that answers ``value`` for every completion token."""

    name = "constant"

    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, sequences: Any) -> list[list[float]]:
        return [[self.value] * len(s.completion_ids) for s in sequences]


def generator(
    *, logprob: float = -0.5, rows: int = 0, logprobs: int | None = None, answer: Any = ...
) -> Callable[[list[list[int]], int, int], Any]:
    """``generate(prompts, max_new_tokens, seed)`` answering two tokens per prompt, each with
    ``logprob``; ``rows``: samples left off a batch of more than one; ``logprobs``: how many
    log-probs each sample holds; ``answer``: what it returns instead."""

    def generate(prompts: list[list[int]], max_new_tokens: int, seed: int) -> Any:
        if answer is not ...:
            return answer
        out = [
            types.SimpleNamespace(
                completion_ids=[seed + i, 3], logprobs=[logprob] * (logprobs or 2)
            )
            for i in range(len(prompts))
        ]
        return out[: len(out) - rows] if len(out) > 1 else out

    return generate


def certify(scorer: Any, *, sequences: Any = None, **kw: Any) -> Callable[[Path], Any]:
    """``certify_batch_invariance(scorer, two canary sequences, 2, **kw)``."""

    def run(tmp: Path) -> Any:
        from precision_plugin._core.canary import certify_batch_invariance
        from precision_plugin._core.scoring import TokenSequence

        canary = [TokenSequence((1, 2), (3, 4)), TokenSequence((1,), (5, 6, 7))]
        return certify_batch_invariance(scorer, canary if sequences is None else sequences, 2, **kw)

    return run


def monitor_check(learner: Any, rollout: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.canary import CanaryMonitor

        return CanaryMonitor().check(0, learner, rollout)

    return run


def equals(expected: Any) -> Callable[[Any, Any], None]:
    def check(result: Any, caplog: Any) -> None:
        assert result == expected, result

    return check


def rows(h: Any) -> list[dict[str, Any]]:
    """The rows (``h``: ``tests/unit/test_bad_inputs.py``, unused: the calls are direct)."""
    out: list[dict[str, Any]] = []

    def bad(id: str, cls: str, run: Any, *names: str, alone: bool = False) -> None:
        row = {"id": id, "cls": cls, "run": isolated(run) if alone else run, "names": names}
        out.append({**row, "raises": PrecisionConfigError})

    def good(id: str, cls: str, run: Any, check: Any) -> None:
        out.append({"id": id, "cls": cls, "run": run, "raises": None, "check": check})

    # -- class 3: numbers outside their domain (they reached scipy, math or torch) -------------
    num = "numbers"
    bad("clopper_pearson k -1", num, intervals("clopper_pearson", -1, 10), "'k'", ">= 0")
    bad(
        "prompts_to_decide n -16",
        num,
        call("_core.decision", "prompts_to_decide", (1.0, 0.5, 1.5), (0.8, 0.3, 1.2), -16),
        "'n'",
        ">= 1",
    )
    bad(
        "clopper_pearson k above n",
        num,
        intervals("clopper_pearson", 11, 10),
        "'k' and 'n'",
        "k <= n",
    )
    bad(
        "variance_normal coverage 1.0",  # was a ZeroDivisionError
        num,
        intervals("variance_normal", 0.1, 10, coverage=1.0),
        "'coverage'",
        "< 1",
    )
    bad(
        "variance_robust coverage 0",
        num,
        intervals("variance_robust", 0.1, [0.1, 0.2, 0.3], coverage=0.0),
        "'coverage'",
        "> 0",
    )
    bad(
        "batch_ess negative length",  # was a math domain error
        num,
        intervals("batch_ess", 0.1, -5, 4),
        "'length'",
        ">= 0",
    )
    bad(
        "batch_ess batch 2**40",
        num,
        intervals("batch_ess", 0.1, 4, 2**40),
        "'batch'",
        "<= 1.04858e+06",
        alone=True,
    )
    bad(
        "mixed_batch_ess negative length",
        num,
        intervals("mixed_batch_ess", 0.1, 0.0, [4, -4]),
        "'lengths'",
        "holds -4 (item 1)",
    )
    bad("z_value coverage 1.5", num, intervals("z_value", 1.5), "'coverage'", "< 1")  # was NaN
    bad("chi2_ppf p 2", num, intervals("chi2_ppf", 2.0, 3.0), "'p'", "<= 1")  # was NaN
    bad("chi2_ppf dof -1", num, intervals("chi2_ppf", 0.5, -1.0), "'dof'", "> 0")  # was NaN
    bad(
        "canary_band seed 2**70",  # was an overflow in torch
        num,
        call("_core.canary.band", "canary_band", [0.1, 0.2, 0.3], seed=2**70),
        "'seed'",
        "out of range",
        alone=True,
    )
    bad(
        "canary_band resamples 10**9",  # was an allocation failure
        num,
        call("_core.canary.band", "canary_band", [0.1, 0.2, 0.3], resamples=10**9),
        "'resamples'",
        "bootstrap resamples",
        alone=True,
    )
    bad(
        "k3_interval resamples 10**9",  # was a 16 GB allocation failure in torch
        num,
        decompose("k3_interval", RATIOS, resamples=10**9),
        "'resamples'",
        "<= 100000",
        alone=True,
    )
    bad(
        "k3_interval seed 2**70",  # was "Overflow when unpacking long long"
        num,
        decompose("k3_interval", RATIOS, seed=2**70),
        "'seed'",
        "<= 9.22337e+18",
        alone=True,
    )
    bad("k3_interval seed -1", num, decompose("k3_interval", RATIOS, seed=-1), "'seed'", ">= 0")
    bad(
        "k3_interval coverage 1.5",  # was torch's "quantile() q values must be in [0, 1]"
        num,
        decompose("k3_interval", RATIOS, coverage=1.5),
        "'coverage'",
        "< 1",
    )
    subsets = {1: RATIOS}
    bad(
        "cause_shares resamples 10**9",
        num,
        decompose("cause_shares", RATIOS, subsets, ["dtype"], resamples=10**9),
        "'resamples'",
        "<= 100000",
        alone=True,
    )
    bad(
        "cause_shares seed 2**70",
        num,
        decompose("cause_shares", RATIOS, subsets, ["dtype"], seed=2**70),
        "'seed'",
        alone=True,
    )
    bad(
        "cause_shares coverage 0",  # was an interval of width 0, silently
        num,
        decompose("cause_shares", RATIOS, subsets, ["dtype"], coverage=0.0),
        "'coverage'",
        "> 0",
    )
    bad(
        "precision_level canary_equal_frac 2",  # a share above 1 proved level 3
        num,
        call("_core.canary.ladder", "precision_level", True, None, 2.0, 1.0),
        "'canary_equal_frac'",
        "<= 1",
    )

    # -- class 4: sequences that do not pair up --------------------------------------------------
    met = "metrics"
    bad(
        "ratio_interval lengths differ",  # returned (6.0, 0.0, 20.2)
        met,
        intervals("ratio_interval", [1, 2, 3], [1]),
        "'numerators' and 'denominators' differ in length",
    )
    bad(
        "expected_batch_ess lengths differ",  # broadcast one sd over three means
        met,
        intervals("expected_batch_ess", [0.0, 0.0, 0.0], [1.0]),
        "'means' and 'sds' differ in length",
    )
    bad(
        "log_ratio ragged rows",  # was a zip() error
        met,
        decompose("log_ratio", [[-1.0, -2.0], [-1.0]], [[-1.0], [-1.0]]),
        "'side' and 'reference' differ in shape",
        "side: 2 rows of 2, 1 tokens",
    )
    bad(
        "log_ratio rows differ",
        met,
        decompose("log_ratio", [[-1.0, -2.0], [-1.0]], [[-1.0, -2.0]]),
        "'side' and 'reference' differ in shape",
    )
    good(
        "log_ratio -inf against -inf is 0",
        met,
        decompose("log_ratio", [[-1.0, -INF], [-2.0]], [[-0.5, -INF], [-1.0]]),
        equals([[-1.0 - -0.5, 0.0], [-2.0 - -1.0]]),
    )
    bad(
        "certify generate one sample short",  # was a zip() error
        met,
        certify(Scorer(-0.5), generate=generator(rows=1)),
        "'generate' answered 1 sample(s) for 2 prompt(s)",
    )
    bad(
        "certify generate log-probs short",  # certified on half the tokens
        met,
        certify(Scorer(-0.5), generate=generator(logprobs=1)),
        "'generate' answered 1 log-probs for the 2 completion tokens of prompt 0",
    )
    bad(
        "certify generate None",  # was "'NoneType' object is not subscriptable"
        met,
        certify(Scorer(-0.5), generate=generator(answer=None)),
        "'generate' answered NoneType",
    )
    bad(
        "certify no sequence",  # "not certified" on no evidence at all
        met,
        certify(Scorer(-0.5), sequences=[]),
        "'sequences'",
        "at least 1 item(s)",
    )
    bad(
        "batch_metrics ragged lists",
        met,
        workers("batch_metrics", [[-0.5, -0.2]], [[-0.5]]),
        "'learner' and 'rollout' differ in shape",
    )

    # -- class 5: non-finite values certified ----------------------------------------------------
    bad(
        "certify scorer +inf",  # was certified batch-invariant (level 2)
        met,
        certify(Scorer(INF)),
        "argument 'scorer'",
        "hold inf (item [0][0])",
    )
    bad(
        "certify scorer -inf",
        met,
        certify(Scorer(-INF)),
        "argument 'scorer'",
        "hold -inf",
    )
    bad("certify scorer NaN", met, certify(Scorer(NAN)), "argument 'scorer'", "hold nan")
    bad(
        "certify generate +inf",  # was certified: inf equals inf bit for bit
        met,
        certify(Scorer(-0.5), generate=generator(logprob=INF)),
        "argument 'generate'",
        "hold inf",
    )
    bad(
        "batch_metrics NaN under the mask",  # was k3_kl=inf without a word
        met,
        workers("batch_metrics", [[-0.5, NAN]], [[-0.5, -0.4]], [[1, 1]]),
        "'learner' holds nan at (row 0, token 1)",
    )
    bad(
        "batch_metrics inf under a tensor mask",
        met,
        workers(
            "batch_metrics",
            torch.tensor([[-0.5, -0.1, -0.3]]),
            torch.tensor([[-0.5, -0.4, INF]]),
            torch.tensor([[1, 0, 1]]),
        ),
        "'rollout' holds inf at (row 0, token 2)",
    )
    good(
        "batch_metrics NaN outside the mask",  # padding: not a token that counts
        met,
        workers("batch_metrics", [[-0.5, NAN]], [[-0.5, -0.4]], [[1, 0]]),
        equals({"bitwise_equal_frac": 1.0, "k3_kl": 0.0}),
    )
    bad(
        "CanaryMonitor check NaN",
        met,
        monitor_check([[-0.5, NAN]], [[-0.5, -0.4]]),
        "learner's log-prob at (row 0, token 1) is nan",
    )
    return out
