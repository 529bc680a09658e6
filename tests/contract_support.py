"""What every contract-test environment's conftest needs: a checkpoint folder with only a
``config.json``, and code run against the *installed* (non-editable) precision_plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

#: A two-layer Llama config: what the config layers resolve (no weights are read).
TINY_LLAMA = {
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


def write_checkpoint(path: Path, config: dict) -> Path:
    """A checkpoint directory holding only ``config.json`` (config layers need no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def run_installed(
    code: str,
    cwd: Path,
    *,
    drop: Iterable[str],
    env: dict[str, str],
    pythonpath: str | None = None,
    timeout: int = 300,
) -> dict[str, str]:
    """Run ``code`` in a fresh interpreter against the *installed* precision_plugin.

    The variables in ``drop`` and ``PYTHONPATH`` are cleared, then ``env`` applied (and
    ``pythonpath``, when given); the process runs outside the repository, so the real
    (non-editable) distribution and its entry points are what load. Returns the ``KEY value``
    lines it printed as a dict, plus its stderr under ``STDERR``.
    """
    gone = {*drop, "PYTHONPATH"}
    environ = {k: v for k, v in os.environ.items() if k not in gone}
    if pythonpath is not None:
        environ["PYTHONPATH"] = pythonpath
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert "site-packages" in out["FILE"], "precision_plugin must be a real (non-editable) install"
    out["STDERR"] = done.stderr
    return out
