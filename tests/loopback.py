"""A loopback HTTP server that answers one path with a body, the way a rollout server's
``/server_info`` does: for the server checks of the vLLM and SGLang adapters."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer


class Answer:
    """What the server answers: ``body()`` (bytes) for a GET of exactly ``path``, 404 else.

    Tests change ``body`` between requests; it is called for every request.
    """

    def __init__(self, path: str, body: Callable[[], bytes] | bytes = b"{}") -> None:
        self.path = path
        self.body: Callable[[], bytes] = body if callable(body) else (lambda: body)
        self.url = ""

    def set(self, body: Callable[[], bytes] | bytes) -> None:
        """Answer ``body`` from now on."""
        self.body = body if callable(body) else (lambda: body)


@contextmanager
def loopback(answer: Answer) -> Iterator[Answer]:
    """Serve ``answer`` on 127.0.0.1 (a free port) for the ``with`` block; ``answer.url`` is the
    base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != answer.path:
                self.send_error(404)
                return
            body = answer.body()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    answer.url = f"http://127.0.0.1:{httpd.server_port}"
    try:
        yield answer
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def serve(status: int = 200, body: bytes = b"{}", *, delay: float = 0.0, length: int | None = None,
          ) -> Iterator[str]:  # fmt: skip
    """A server on 127.0.0.1 answering every GET with ``status`` and ``body`` after ``delay``
    seconds; ``length`` announces another Content-Length (a body cut short)."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if delay:
                stop.wait(delay)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            if length is not None:
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
