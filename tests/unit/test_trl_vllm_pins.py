"""The TRL objects the vLLM server check walks, pinned against the installed TRL.

``precision_plugin.vllm.adapter.precision_train_begin`` reads ``trainer.vllm_generation``, its
``mode``, its ``vllm_client`` (server mode) or ``llm`` (colocate mode), and the client's
``get_server_info()``. Here those are TRL's own classes: a real ``VLLMGeneration`` in server
mode with a real ``VLLMClient`` talking HTTP to a stand-in server. Only what needs vLLM itself
is lifted: TRL's "is vLLM installed" check and the NCCL weight-sync communicator.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
import torch

pytest.importorskip("trl")

from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm import adapter


class _Server(BaseHTTPRequestHandler):
    """What TRL's client asks a ``vllm serve`` / ``trl vllm-serve`` server for."""

    dtype: ClassVar[str] = "torch.bfloat16"

    def do_GET(self) -> None:
        if self.path.startswith("/health"):
            body: Any = {}
        elif self.path.startswith("/v1/models"):
            body = {"data": [{"id": "tiny"}]}
        elif self.path.startswith("/server_info"):
            body = {
                "vllm_config": {
                    "model_config": {"dtype": self.dtype, "disable_cascade_attn": None},
                    "cache_config": {"cache_dtype": "auto"},
                },
                "system_env": {"vllm_version": "0.33.0"},
            }
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server():
    httpd = HTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def generation(server, monkeypatch):
    """TRL's ``VLLMGeneration`` in server mode, built by TRL's own constructor."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from trl.generation import vllm_client, vllm_generation

    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(vllm_client.VLLMClient, "init_communicator", lambda self, device=None: None)
    AcceleratorState._reset_state(True)
    try:
        yield vllm_generation.VLLMGeneration(
            model=torch.nn.Linear(2, 2),
            accelerator=Accelerator(cpu=True),
            processing_class=None,
            mode="server",
            server_base_url=server,
            server_timeout=5.0,
        )
    finally:
        AcceleratorState._reset_state(True)


def test_grpo_trainer_keeps_its_vllm_backend_where_the_check_looks() -> None:
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)
    assert {"use_vllm", "vllm_mode"} <= {f.name for f in dataclasses.fields(GRPOConfig)}
    source = inspect.getsource(VLLMGeneration._init_vllm)
    assert "self.vllm_client = VLLMClient(" in source  # server mode, main process only
    assert "self.llm = LLM(" in source  # colocate mode: verify_engine reads it


def test_the_server_check_walks_trls_real_objects(generation, tmp_path) -> None:
    from trl import GRPOConfig
    from trl.generation.vllm_client import VLLMClient

    assert generation.mode == "server"
    assert isinstance(generation.vllm_client, VLLMClient)
    args = GRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="server", bf16=False, report_to=[]
    )
    trainer = type("Trainer", (), {"vllm_generation": generation})()
    strict = PrecisionPolicy(strictness="error")
    with pytest.raises(PrecisionMismatchError, match=r"vLLM server at .* runs torch\.bfloat16"):
        adapter.precision_train_begin(policy=strict, args=args, trainer=trainer)
    _Server.dtype = "torch.float16"
    try:
        adapter.precision_train_begin(policy=strict, args=args, trainer=trainer)
    finally:
        _Server.dtype = "torch.bfloat16"
