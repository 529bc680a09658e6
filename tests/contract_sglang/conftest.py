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

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

STUBS = Path(__file__).resolve().parent / "stubs"
runpy.run_path(str(STUBS / "sitecustomize.py"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for name in ("PRECISION_PLUGIN", "SGLANG_PLUGINS", "SGLANG_SANITIZE_NAN_LOGITS"):
    os.environ.pop(name, None)

sglang = pytest.importorskip("sglang", reason="the SGLang contract environment is not active")

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}


def write_checkpoint(path: Path, config: dict) -> str:
    """A checkpoint folder holding only ``config.json`` (SGLang's config layer reads no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def llama_dir(tmp_path):
    return write_checkpoint(tmp_path / "llama", LLAMA)


def cpu_argv(model: str, *extra: str) -> list[str]:
    """An ``sglang serve`` command line that resolves on CPU without a tokenizer."""
    return ["--model-path", model, "--device", "cpu", "--skip-tokenizer-init", *extra]


def run_installed(code: str, cwd: Path, **env: str) -> dict[str, str]:
    """Run ``code`` in a fresh interpreter against the *installed* precision_plugin.

    ``PRECISION_PLUGIN``/``SGLANG_PLUGINS`` are cleared, then ``env`` applied; the process runs
    outside the repository with only the torchvision stub on ``PYTHONPATH``, so the real
    (non-editable) distribution and its entry point are what load. Returns the ``KEY value``
    lines it printed as a dict.
    """
    drop = ("PRECISION_PLUGIN", "SGLANG_PLUGINS", "PYTHONPATH", "SGLANG_SANITIZE_NAN_LOGITS")
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ["PYTHONPATH"] = str(STUBS)
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert "site-packages" in out["FILE"], "precision_plugin must be a real (non-editable) install"
    out["STDERR"] = done.stderr
    return out
