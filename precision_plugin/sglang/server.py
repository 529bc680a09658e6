"""Ask a running SGLang server what it runs: ``GET /server_info``.

SGLang answers with ``ServerArgs.resolved_dict()`` plus ``launch_command``, ``version`` and live
state (``entrypoints/http_server.py`` ``server_info``). Its ``dtype`` is the launch's string, so
a server started with ``auto`` says ``auto``; the dtype that runs is then decided here from the
checkpoint's ``config.json`` (``model_path``), as SGLang decides it, when that file is on this
machine.
"""

from __future__ import annotations

import logging
import urllib.error
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.report import Finding
from precision_plugin._core.manager import resolve_policy
from precision_plugin._core.serving import get_json, server_url, settle_findings, unusable_answer
from precision_plugin.errors import (
    PrecisionConfigError,
    ServerAnswerError,
    ServerUnreachableError,
)
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.sglang.args import read_server_args
from precision_plugin.sglang.check import FRAMEWORK, launch_findings

log = logging.getLogger("precision_plugin")

#: SGLang's endpoint (``/get_server_info`` is its deprecated alias).
SERVER_INFO = "/server_info"


def fetch_server_info(base_url: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET {base_url}/server_info`` of an SGLang server; the whole answer."""
    try:
        info = get_json(base_url, SERVER_INFO, engine="SGLang", timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise PrecisionConfigError(
                f"{base_url} refused GET {SERVER_INFO} with HTTP {exc.code} ({exc.reason}): a "
                f"proxy or an authentication layer stands in front of the server. Pass the "
                f"SGLang server's own base URL, or the /server_info JSON."
            ) from None
        raise PrecisionConfigError(
            f"{base_url} answered GET {SERVER_INFO} with HTTP {exc.code}: it is not an SGLang "
            f"server (SGLang >= 0.4 serves {SERVER_INFO}). Pass the base URL of the SGLang "
            f"server (e.g. http://localhost:30000), or verify a vLLM server with "
            f"precision_plugin.vllm.verify_server."
        ) from None
    if not isinstance(info, Mapping) or "dtype" not in info:
        raise ServerAnswerError(
            f"{base_url}{SERVER_INFO} answered without a 'dtype' field, which SGLang's "
            f"/server_info always has: it is not an SGLang server.",
            kind="other_program",
        )
    return dict(info)


@checked(url=server_url("SGLang", info_keys=("dtype",)))
def verify_server(
    url: str | Mapping[str, Any], policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> list[Finding]:
    """Ask a running SGLang server what it runs and compare with ``policy`` (the learner's).

    ``url`` is the server's base URL (``"http://localhost:30000"``) or its ``/server_info``
    JSON. The dtype it reports is used as is; ``auto`` is decided from the checkpoint's
    ``config.json`` at the reported ``model_path`` when that is on this machine (else a warning
    says it cannot be told). The traps of
    [`check_server_args`][precision_plugin.sglang.check_server_args] that the answer shows
    (``rl_on_policy_target``, the KV-cache dtype, bf16-only backends, EAGLE tree drafting) are
    reported too. A mismatch raises
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] under
    ``strictness="error"``, else it is logged as a warning; the findings are returned either
    way. When nothing answers at ``url``, the one finding is a warning that asks whether a
    server is running there.
    """
    pol = resolve_policy(policy)
    if isinstance(url, Mapping):
        info, where = dict(url), "SGLang server"
    else:  # a URL (the boundary checked it)
        try:
            info = fetch_server_info(url)
        except ServerUnreachableError as exc:
            finding = Finding(
                FRAMEWORK, "warning", str(exc), fix="start the server, or fix its URL"
            )
            log.warning("%s Fix: %s.", finding.message, finding.fix)
            return [finding]
        except ServerAnswerError as exc:  # it answered, wrongly: an error under "error"
            return unusable_answer(FRAMEWORK, exc, pol)
        where = f"SGLang server at {url.rstrip('/')}"
    if info.get("version"):
        where = f"{where} (SGLang {info['version']})"
    # The server's environment is not reported, so SGLANG_SANITIZE_NAN_LOGITS cannot be seen.
    findings = launch_findings(read_server_args(info), pol, environ={}, where=where)
    return settle_findings(findings, pol)
