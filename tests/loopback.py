"""A loopback HTTP server that answers one path with a body, the way a rollout server's
``/server_info`` does: for the server checks of the vLLM and SGLang adapters."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer


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
