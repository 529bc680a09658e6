"""Asking a running rollout server what it runs: one HTTP GET, and settling what was found.

Shared by the vLLM and SGLang server checks (``precision_plugin.vllm.verify_server``,
``precision_plugin.sglang.verify_server``): the request, the message when nothing answers at the
URL, and what a finding leads to under the policy's strictness.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from precision_plugin.boundary import Invalid, Validator
from precision_plugin.errors import (
    PrecisionConfigError,
    PrecisionMismatchError,
    ServerUnreachableError,
)
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.report import Finding

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


def get_json(base_url: str, path: str, *, engine: str, timeout: float = 10.0) -> Any:
    """``GET {base_url}{path}`` and its JSON body.

    Raises [`ServerUnreachableError`][precision_plugin.errors.ServerUnreachableError] when
    nothing answers (refused connection, unknown host, timeout), asking whether an ``engine``
    server runs at that URL; ``PrecisionConfigError`` when the answer is not JSON (another kind
    of server). An HTTP error status
    (``urllib.error.HTTPError``, e.g. 404 for a missing endpoint) is left to the caller.
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
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: http.client's
        reason = getattr(exc, "reason", exc)
        raise ServerUnreachableError(
            f"Could not ask the {engine} server at {base} for its configuration ({reason}). "
            f"Is {article} {engine} server running at {base}? Start it first, or pass the base "
            f"URL it listens on (scheme, host and port, e.g. {example})."
        ) from None
    try:
        return json.loads(body.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PrecisionConfigError(
            f"{url} answered, but not with JSON ({body[:80]!r}): is this an {engine} server? "
            f"Pass the base URL of the {engine} server."
        ) from None


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
