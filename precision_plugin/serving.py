"""Asking a running rollout server what it runs: one HTTP GET, and settling what was found.

Shared by the vLLM and SGLang server checks (``precision_plugin.vllm.verify_server``,
``precision_plugin.sglang.verify_server``): the request, the message when nothing answers at the
URL, and what a finding leads to under the policy's strictness.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

from precision_plugin.errors import (
    PrecisionConfigError,
    PrecisionMismatchError,
    ServerUnreachableError,
)
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.report import Finding

log = logging.getLogger("precision_plugin")


def get_json(base_url: str, path: str, *, engine: str, timeout: float = 10.0) -> Any:
    """``GET {base_url}{path}`` and its JSON body.

    Raises [`ServerUnreachableError`][precision_plugin.errors.ServerUnreachableError] when
    nothing answers (refused connection, unknown host, timeout), asking whether an ``engine``
    server runs at that URL; ``PrecisionConfigError`` when the answer is not JSON (another kind
    of server). An HTTP error status
    (``urllib.error.HTTPError``, e.g. 404 for a missing endpoint) is left to the caller.
    """
    base = base_url.rstrip("/")
    url = f"{base}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerUnreachableError(
            f"Could not ask the {engine} server at {base} for its configuration ({reason}). "
            f"Is an {engine} server running at {base}? Start it first, or pass the base URL "
            f"it listens on (scheme, host and port, e.g. http://localhost:30000)."
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
