"""Asking a running rollout server what it runs: one HTTP GET, and settling what was found.

Shared by the vLLM and SGLang server checks (``precision_plugin.vllm.verify_server``,
``precision_plugin.sglang.verify_server``): the request, the message when nothing answers at the
URL, and what a finding leads to under the policy's strictness.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import Invalid, Validator
from precision_plugin._base.report import Finding
from precision_plugin.errors import (
    PrecisionConfigError,
    PrecisionMismatchError,
    ServerAnswerError,
    ServerUnreachableError,
)
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")


#: Each engine's server, as the messages name it: (article, default base URL).
_SERVERS = {"vLLM": ("a", "http://localhost:8000"), "SGLang": ("an", "http://localhost:30000")}


def _article_and_example(engine: str) -> tuple[str, str]:
    return _SERVERS.get(engine, ("a", "http://localhost:8000"))


def url_problem(value: str) -> str | None:
    """Why ``value`` is not an ``http(s)://host[:port]`` base URL (``None`` when it is one):
    the same parse ``urllib`` makes when asked to fetch it, done before any request."""
    text = value.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or > 65535
    except ValueError as exc:
        return str(exc)
    if parts.scheme.lower() not in ("http", "https"):
        return "no http:// or https:// scheme" if "://" not in text else f"scheme {parts.scheme!r}"
    if not parts.hostname:
        return "no host"
    return None


def server_url(engine: str, *, info_keys: tuple[str, ...], also: str = "") -> Validator:
    """A running ``engine`` server: its base URL (``http(s)://host[:port]``) or its
    ``/server_info`` JSON, which holds one of ``info_keys`` (every real answer does);
    ``also`` names another accepted kind in the message."""
    _, example = _article_and_example(engine)
    kinds = f"the {engine} server's base URL such as {example!r}, or its /server_info JSON"
    if also:
        kinds += f", or {also}"

    def check(value: Any) -> Any:
        if isinstance(value, str):
            problem = url_problem(value)
            if problem is not None:
                raise Invalid(f"is not a server URL ({problem}); pass {kinds}")
        elif isinstance(value, Mapping) and not any(k in value for k in info_keys):
            keys = " or ".join(repr(k) for k in info_keys)
            raise Invalid(
                f"has no {keys} key ({engine}'s /server_info answer always has one), so there "
                f"is nothing to check; pass {kinds}"
            )
        return value

    return Validator(
        f"an {engine} server URL or /server_info JSON",
        check,
        ("", "localhost:8000", "ftp://x", "http://[::1", "http://h:abc", {}),
    )


def _error(
    kind: str, cls: type[ServerUnreachableError] | type[ServerAnswerError], message: str
) -> Exception:
    return cls(message, kind=kind)


def _is_timeout(exc: BaseException) -> bool:
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason)


def get_json(base_url: str, path: str, *, engine: str, timeout: float = 10.0) -> Any:
    """``GET {base_url}{path}`` and its JSON body, each failure named for what it is.

    Raises [`ServerUnreachableError`][precision_plugin.errors.ServerUnreachableError] when no
    answer came: ``kind`` ``not_listening`` (refused connection, unknown host), ``timeout`` (the
    timeout is named) or ``not_ready`` (HTTP 503: listening, still loading);
    [`ServerAnswerError`][precision_plugin.errors.ServerAnswerError] when an answer came but is
    unusable: ``server_error`` (HTTP 5xx, with the start of its body), ``truncated`` (the body
    ended before its announced length) or ``not_json`` (another kind of server). Another HTTP
    error status (``urllib.error.HTTPError``, e.g. 404 for a missing endpoint) is left to the
    caller, which knows what the endpoint's absence means.
    """
    base = base_url.strip().rstrip("/")
    url = f"{base}{path}"
    article, example = _article_and_example(engine)
    problem = url_problem(base)
    if problem is not None:
        raise PrecisionConfigError(
            f"{base_url!r} is not a server URL ({problem}); pass the {engine} server's base "
            f"URL (scheme, host and port, e.g. {example})."
        )
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code < 500:
            raise
        detail = _body_start(exc)
        if exc.code == 503:
            raise _error(
                "not_ready",
                ServerUnreachableError,
                f"The {engine} server at {base} is listening but not ready (HTTP 503 to GET "
                f"{path}{detail}): it is still loading the model, or shutting down. Wait until "
                f"its /health answers 200, then check again.",
            ) from None
        raise _error(
            "server_error",
            ServerAnswerError,
            f"The {engine} server at {base} answered GET {path} with HTTP {exc.code}, an error "
            f"inside the server{detail}; its log says why. Fix the server, then check again.",
        ) from None
    except http.client.IncompleteRead as exc:
        raise _error(
            "truncated",
            ServerAnswerError,
            f"The answer of {url} ended early ({len(exc.partial)} bytes received, "
            f"{exc.expected} more announced): the connection was cut. Check the server (or "
            f"a proxy in between) and try again.",
        ) from None
    except (http.client.RemoteDisconnected, ConnectionResetError) as exc:
        raise _error(
            "truncated",
            ServerAnswerError,
            f"{url} closed the connection without a complete answer ({type(exc).__name__}): "
            f"is {article} {engine} server running there, and not crashing? Check its log.",
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: http.client's
        reason = getattr(exc, "reason", exc)
        if _is_timeout(exc):
            raise _error(
                "timeout",
                ServerUnreachableError,
                f"The {engine} server at {base} did not answer GET {path} within the "
                f"{timeout:g} s timeout: it is busy or stuck, or a firewall drops the "
                f"connection. Try again when it is idle, or pass a larger timeout.",
            ) from None
        raise _error(
            "not_listening",
            ServerUnreachableError,
            f"Could not ask the {engine} server at {base} for its configuration ({reason}): "
            f"nothing listens there. Is {article} {engine} server running at {base}? Start it "
            f"first, or pass the base URL it listens on (scheme, host and port, e.g. "
            f"{example}).",
        ) from None
    try:
        return json.loads(body.decode())
    except RecursionError:
        raise _error(
            "not_json",
            ServerAnswerError,
            f"{url} answered with JSON nested too deeply to read: is this {article} {engine} "
            f"server? Pass the base URL of the {engine} server.",
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _error(
            "not_json",
            ServerAnswerError,
            f"{url} answered, but not with JSON ({body[:80]!r}): is this {article} {engine} "
            f"server? Pass the base URL of the {engine} server.",
        ) from None


def _body_start(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(200).decode("utf-8", "replace").strip()
    except (OSError, ValueError, http.client.HTTPException):
        text = ""
    return f": {text[:120]!r}" if text else ""


def unusable_answer(framework: str, exc: Exception, policy: PrecisionPolicy) -> list[Finding]:
    """A server that answered with an error or a truncated body: its precision cannot be
    verified. Under ``strictness="error"`` that is raised as
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] (an unverified
    server is no verified one), else one warning finding. An answer that is not JSON, or JSON
    of another program, means the URL is not the engine's server: that
    ``ServerAnswerError`` is raised as it is, whatever the strictness (fix the URL)."""
    if getattr(exc, "kind", "") in ("not_json", "other_program"):
        raise exc
    if policy.strictness == "error":
        raise PrecisionMismatchError(
            f"{exc} The server's precision could not be verified (strictness='error')."
        ) from None
    finding = Finding(framework, "warning", str(exc), fix="fix the server, then check again")
    log.warning("%s Fix: %s.", finding.message, finding.fix)
    return [finding]


def settle_findings(findings: list[Finding], policy: PrecisionPolicy) -> list[Finding]:
    """Raise the ``error`` findings together under strictness ``error``; log the rest.

    Warnings and errors (under ``warn``) are logged as warnings, the others at info level; the
    findings are returned.
    """
    errors = [f for f in findings if f.status == "error"]
    if errors and policy.strictness == "error":
        raise PrecisionMismatchError(
            " ".join(f"{f.message} Fix: {f.fix}." for f in errors) + " (strictness='error')"
        )
    for f in findings:
        if f.status in ("warning", "error"):
            log.warning("%s Fix: %s.", f.message, f.fix)
        else:
            log.info("%s", f.message)
    return findings
