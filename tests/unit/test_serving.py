"""Server probes name what went wrong: real HTTP servers on 127.0.0.1, each answer bounded.

Each failure a rollout server can give (nothing listening, listening but loading, an error, too
slow, a cut-off body, something that is not JSON, another program) gets its own message and
``kind``; a vLLM or SGLang check turns an unusable answer into an error under
``strictness="error"`` and a warning otherwise.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from precision_plugin import PrecisionPolicy
from precision_plugin._core.serving import get_json
from precision_plugin.errors import (
    PrecisionMismatchError,
    ServerAnswerError,
    ServerUnreachableError,
)
from tests.loopback import free_port, serve

STRICT = PrecisionPolicy(strictness="error")
VLLM_INFO = {"vllm_config": {"model_config": {"dtype": "torch.float16"}, "cache_config": {}}}


def kind_of(url: str, *, timeout: float = 2.0) -> tuple[str, str]:
    with pytest.raises((ServerUnreachableError, ServerAnswerError)) as err:
        get_json(url, "/server_info", engine="vLLM", timeout=timeout)
    return err.value.kind, str(err.value)  # type: ignore[union-attr]


def test_not_listening():
    kind, message = kind_of(f"http://127.0.0.1:{free_port()}")
    assert kind == "not_listening" and "nothing listens there" in message


def test_listening_but_not_ready():
    with serve(503, b"loading") as url:
        kind, message = kind_of(url)
    assert kind == "not_ready"
    assert "listening but not ready (HTTP 503" in message and "'loading'" in message


@pytest.mark.parametrize("status", [500, 502])
def test_an_error_inside_the_server(status: int):
    with serve(status, b"Traceback: CUDA out of memory") as url:
        kind, message = kind_of(url)
    assert kind == "server_error"
    assert f"HTTP {status}, an error inside the server" in message
    assert "CUDA out of memory" in message


def test_a_timeout_is_named_with_its_length():
    with serve(200, b"{}", delay=3.0) as url:
        started = time.monotonic()
        kind, message = kind_of(url, timeout=0.5)
        assert time.monotonic() - started < 2.5  # bounded by the timeout, not the server
    assert kind == "timeout" and "within the 0.5 s timeout" in message


def test_a_truncated_body():
    with serve(200, b'{"vllm_config": ', length=500) as url:
        kind, message = kind_of(url)
    assert kind == "truncated" and "ended early" in message


@pytest.mark.parametrize("body", [b"<html>nginx</html>", b"\xff\xfe", b"[" * 100_000])
def test_not_json(body: bytes):
    with serve(200, body) as url:
        kind, message = kind_of(url)
    assert kind == "not_json" and "is this a vLLM server?" in message


def test_an_answer_from_another_program_is_named_by_vllm():
    from precision_plugin.vllm import verify_server

    sglang_answer = json.dumps({"dtype": "float16", "model_path": "m", "version": "0.5"}).encode()
    with serve(200, sglang_answer) as url:
        for policy in (STRICT, PrecisionPolicy()):  # a wrong URL, whatever the strictness
            with pytest.raises(ServerAnswerError, match="another program answers there") as err:
                verify_server(url, policy)
            assert err.value.kind == "other_program"  # type: ignore[attr-defined]


def test_a_vllm_http_500_is_an_error_under_strict_and_a_warning_otherwise():
    from precision_plugin.vllm import verify_server

    with serve(500, b"boom") as url:
        with pytest.raises(PrecisionMismatchError, match="HTTP 500, an error inside the server"):
            verify_server(url, STRICT)
        found = verify_server(url, PrecisionPolicy())
    assert [f.status for f in found] == ["warning"] and "HTTP 500" in found[0].message


def test_a_loading_sglang_server_is_not_called_another_program():
    from precision_plugin.sglang import verify_server

    with serve(503, b"") as url:
        found = verify_server(url, STRICT)  # unreachable stays a warning, as for vLLM
    assert [f.status for f in found] == ["warning"]
    assert "not ready (HTTP 503" in found[0].message and "not an SGLang" not in found[0].message
    with serve(500, b"boom") as url, pytest.raises(PrecisionMismatchError, match="HTTP 500"):
        verify_server(url, STRICT)


def test_a_good_answer_still_verifies():
    from precision_plugin.vllm import verify_server

    with serve(200, json.dumps(VLLM_INFO).encode()) as url:
        found: list[Any] = verify_server(url, STRICT)
    assert found[0].status == "ok"
