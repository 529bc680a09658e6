"""The canary's and the ladder's vLLM settings against the real vLLM package (config layer only).

Run in the vLLM contract environment: the batch-invariant switch is a variable the installed
vLLM reads, ``batch_invariant='on'`` sets it and ``disable()`` takes it back, and the canary's
scoring request is a real ``SamplingParams`` whose ``prompt_logprobs`` entries the scorer reads.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os

import pytest
from packaging.version import Version

import precision_plugin as pp
from precision_plugin._core.batch_invariance import ENV, VLLM_MIN
from precision_plugin._core.scoring import TokenSequence
from precision_plugin._core.scoring.vllm import completion_logprobs, sampling_params

INSTALLED = Version(importlib.metadata.version("vllm"))
#: The suite runs in each vLLM environment (0.33 and 0.10.1): each checks its own side of 0.11.1.
HAS_MODE = Version(VLLM_MIN) <= INSTALLED


def test_the_installed_vllm_reads_the_batch_invariant_variable_from_0_11_1() -> None:
    import vllm.envs as envs

    assert (ENV in envs.environment_variables) is HAS_MODE


def test_on_sets_it_for_engines_and_disable_takes_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    import vllm.envs as envs

    pp.enable(pp.PrecisionPolicy.from_dict({"batch_invariant": "on"}))
    try:
        if HAS_MODE:
            assert envs.environment_variables[ENV]() is True  # what vLLM reads at engine start
        else:  # an older vLLM has no such mode: nothing is set that it would ignore
            assert ENV not in os.environ
    finally:
        pp.disable()
    assert ENV not in os.environ
    if HAS_MODE:
        assert envs.environment_variables[ENV]() is False


def test_the_scoring_request_is_a_real_sampling_params() -> None:
    params = sampling_params(importlib.import_module("vllm"))
    assert (params.max_tokens, params.temperature, params.prompt_logprobs) == (1, 1.0, 1)


def test_the_scorer_reads_vllm_logprob_entries() -> None:
    try:
        from vllm.logprobs import Logprob
    except ModuleNotFoundError:  # vLLM <= 0.10 keeps it in vllm.sequence
        from vllm.sequence import Logprob

    seq = TokenSequence((5, 6), (7, 8))
    entries = [None, {6: Logprob(-0.5)}, {7: Logprob(-1.25), 3: Logprob(-0.1)}, {8: Logprob(-2.0)}]
    assert completion_logprobs(entries, seq) == [-1.25, -2.0]


def test_the_invariant_backends_are_those_vllms_classes_declare() -> None:
    from precision_plugin.vllm.invariance import invariant_backends

    found = invariant_backends()
    try:
        from vllm.v1.attention.backend import AttentionBackend
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ModuleNotFoundError:  # vLLM 0.10.1: no per-backend declaration to read
        assert found is None
        return
    assert hasattr(AttentionBackend, "supports_batch_invariance")
    assert found is not None and "FLASH_ATTN" in found and "FLASHINFER" not in found
    checked = 0
    for member in AttentionBackendEnum:
        try:
            cls = member.get_class()  # some backends import CUDA kernels: not on CPU
        except Exception:
            continue
        checked += 1
        assert cls.supports_batch_invariance() is (member.name in found), member.name
    assert checked >= 1


def test_engine_kwargs_refuse_an_unsupported_backend_under_strict(monkeypatch) -> None:
    from precision_plugin.errors import PrecisionConfigError
    from precision_plugin.vllm import engine_kwargs

    if not HAS_MODE:
        pytest.skip("no batch-invariant mode before vLLM 0.11.1")
    monkeypatch.delenv(ENV, raising=False)
    strict = pp.PrecisionPolicy.from_dict({"batch_invariant": "on", "strictness": "error"})
    with pytest.raises(PrecisionConfigError, match=r"attention backend FLASHINFER"):
        engine_kwargs({"model": "m", "attention_backend": "FLASHINFER"}, strict, capability=None)
    out = engine_kwargs({"model": "m", "attention_backend": "FLASH_ATTN"}, strict, capability=None)
    assert out["attention_backend"] == "FLASH_ATTN"
