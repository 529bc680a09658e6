"""vLLM as the probe's rollout engine on a real GPU (skipped without CUDA and vLLM).

Run by scripts/gpu_check.sh; the measurements themselves come from ``precision-plugin probe``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="needs vLLM")

from precision_plugin.vllm import cascade_guard, verify_engine  # noqa: E402
from precision_plugin.vllm.probe_engine import VLLMRolloutEngine  # noqa: E402
from tests.gpu.make_qwen2 import save_tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return str(save_tiny_qwen2(tmp_path_factory.mktemp("qwen2")))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_probe_engine_runs_the_policy_dtype(qwen2_dir, dtype):
    from precision_plugin.policy import PrecisionPolicy

    engine = VLLMRolloutEngine(qwen2_dir, dtype, "cuda", seed=0)
    try:
        findings = verify_engine(engine.llm, PrecisionPolicy(dtype=dtype, strictness="error"))
        assert findings[0].status == "ok"
        prompts = [[1, 40, 41, 42, 43], [1, 50, 51], [1, 60, 61, 62]]
        samples = engine.generate(prompts, max_new_tokens=16, seed=0)
        assert [s.prompt_ids for s in samples] == prompts
        for s in samples:
            assert 1 <= len(s.completion_ids) <= 16
            assert len(s.logprobs) == len(s.completion_ids)
            assert all(math.isfinite(x) and x <= 0 for x in s.logprobs)
        again = engine.generate(prompts, max_new_tokens=16, seed=0)
        assert [s.completion_ids for s in again] == [s.completion_ids for s in samples]
    finally:
        engine.close()


def test_cascade_decision_for_this_gpu():
    decision = cascade_guard()
    print(decision.summary())
    assert decision.capability is not None
