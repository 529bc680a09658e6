"""Contract tests run in the separate SGLang environment (scripts/setup_sglang_env.sh), on CPU.

They drive SGLang 0.5.23's own config layer: its CLI parser (``prepare_server_args``),
``ServerArgs.resolve_once`` with ``--device cpu`` on a checkpoint folder that holds only a
``config.json``, ``ModelConfig.from_server_args``, its plugin loader (``load_plugins``) with the
installed precision_plugin's real ``sglang.srt.plugins`` entry point, and the payload of its
``/server_info``. CPU workaround (test code only): ``stubs/sitecustomize.py`` stands in for
``torchvision``, whose PyPI wheel needs CUDA; it is loaded here and put on ``PYTHONPATH`` for
the subprocesses.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest

STUBS = Path(__file__).resolve().parent / "stubs"
runpy.run_path(str(STUBS / "sitecustomize.py"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for name in ("PRECISION_PLUGIN", "SGLANG_PLUGINS", "SGLANG_SANITIZE_NAN_LOGITS"):
    os.environ.pop(name, None)

sglang = pytest.importorskip("sglang", reason="the SGLang contract environment is not active")

from tests import contract_support  # noqa: E402
from tests.contract_support import TINY_LLAMA, write_checkpoint  # noqa: E402

LLAMA = TINY_LLAMA


@pytest.fixture
def llama_dir(tmp_path):
    return str(write_checkpoint(tmp_path / "llama", LLAMA))


def cpu_argv(model: str, *extra: str) -> list[str]:
    """An ``sglang serve`` command line that resolves on CPU without a tokenizer."""
    return ["--model-path", str(model), "--device", "cpu", "--skip-tokenizer-init", *extra]


def run_installed(code: str, cwd: Path, **env: str) -> dict[str, str]:
    """Run ``code`` against the installed precision_plugin, ``PRECISION_PLUGIN``/
    ``SGLANG_PLUGINS``/``SGLANG_SANITIZE_NAN_LOGITS`` cleared, only the torchvision stub on
    ``PYTHONPATH``, then ``env`` applied (``tests.contract_support.run_installed``)."""
    drop = ("PRECISION_PLUGIN", "SGLANG_PLUGINS", "SGLANG_SANITIZE_NAN_LOGITS")
    return contract_support.run_installed(code, cwd, drop=drop, env=env, pythonpath=str(STUBS))
