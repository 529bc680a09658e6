"""The attention-backend check of batch_invariant='on' (precision_plugin.vllm.invariance), on a
stand-in vLLM source tree laid out as vLLM 0.33's (its real list: tests/contract)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm import invariance
from precision_plugin.vllm.invariance import (
    attention_backend_findings,
    check_attention_backend,
    invariant_backends,
    selected_backend,
)

REGISTRY = """
class AttentionBackendEnum(Enum):
    A = "vllm.v1.attention.backends.a.ABackend"
    B = "vllm.v1.attention.backends.b.BBackend"
    SUB = "vllm.v1.attention.backends.b.SubOfA"
    REL = "vllm.v1.attention.backends.c.RelOfA"
    NO = ""
"""
FILES = {
    "v1/attention/backend.py": "class AttentionBackend:\n    @classmethod\n"
    "    def supports_batch_invariance(cls):\n        return False\n",
    "v1/attention/backends/registry.py": REGISTRY,
    "v1/attention/backends/a.py": "class ABackend(AttentionBackend):\n    @classmethod\n"
    "    def supports_batch_invariance(cls):\n        return True\n",
    "v1/attention/backends/c.py": "from .a import ABackend as Base\nclass RelOfA(Base):\n    pass\n",
    "v1/attention/backends/b.py": "from vllm.v1.attention.backends.a import ABackend\n"
    "class BBackend(AttentionBackend):\n    pass\nclass SubOfA(ABackend):\n    pass\n",
}


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "vllm"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "__init__.py").write_text("")
    monkeypatch.setattr(invariance, "_vllm_root", lambda: root)
    invariance._parse.cache_clear()
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    return root


def on(strictness: str = "warn") -> PrecisionPolicy:
    return PrecisionPolicy.from_dict({"batch_invariant": "on", "strictness": strictness})


def test_the_list_is_what_the_backend_classes_declare(fake_vllm: Path) -> None:
    assert invariant_backends() == frozenset({"A", "SUB", "REL"})  # SUB, REL inherit A's True


def test_a_vllm_whose_backends_declare_nothing_gives_none(fake_vllm: Path) -> None:
    (fake_vllm / "v1/attention/backend.py").write_text("class AttentionBackend:\n    pass\n")
    assert invariant_backends() is None


def test_the_selected_backend_from_kwargs_config_or_environment() -> None:
    assert selected_backend({"attention_backend": "flash_attn"}) == "FLASH_ATTN"
    assert selected_backend({"attention_config": {"backend": "FLASHINFER"}}) == "FLASHINFER"
    assert selected_backend({}, {"VLLM_ATTENTION_BACKEND": "TRITON_MLA"}) == "TRITON_MLA"
    assert selected_backend({"attention_backend": "auto"}) is None
    assert selected_backend(None, {}) is None


def test_an_unsupported_backend_is_a_warning_or_refused_under_strict() -> None:
    supported = frozenset({"FLASH_ATTN", "TRITON_ATTN"})
    (finding,) = attention_backend_findings(on(), "FLASHINFER", supported)
    assert finding.status == "warning"
    assert "supports only FLASH_ATTN, TRITON_ATTN" in finding.message
    with pytest.raises(PrecisionConfigError, match=r"attention backend FLASHINFER"):
        attention_backend_findings(on("error"), "FLASHINFER", supported)
    assert attention_backend_findings(on("error"), "FLASH_ATTN", supported) == []
    off = PrecisionPolicy.from_dict({"strictness": "error"})
    assert attention_backend_findings(off, "FLASHINFER", supported) == []
    assert attention_backend_findings(on("error"), "FLASHINFER", None) == []


def test_check_reads_the_installed_list(fake_vllm: Path) -> None:
    assert check_attention_backend(on(), {"attention_backend": "A"}) == []
    (finding,) = check_attention_backend(on(), environ={"VLLM_ATTENTION_BACKEND": "B"})
    assert "supports only A, REL, SUB" in finding.message
