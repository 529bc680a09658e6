"""Verify what a vLLM server or a colocated engine actually runs against the precision policy.

A server is asked through ``GET /server_info?config_format=json`` (vLLM's dev endpoint, on with
``VLLM_SERVER_DEV_MODE=1``, which ``trl vllm-serve`` sets), the same call as TRL's
``VLLMClient.get_server_info()``; its ``vllm_config`` holds ``model_config.dtype`` (e.g.
``"torch.float16"``), ``model_config.disable_cascade_attn`` and ``cache_config.cache_dtype``.
"""

from __future__ import annotations

import logging
import urllib.error
from collections.abc import Mapping
from typing import Any

from precision_plugin._base import versions
from precision_plugin._base.boundary import Invalid, Validator, checked
from precision_plugin._base.report import Finding
from precision_plugin._core.manager import requested_policy, resolve_policy
from precision_plugin._core.serving import get_json, server_url, settle_findings, unusable_answer
from precision_plugin.errors import (
    PrecisionConfigError,
    ServerAnswerError,
    ServerUnreachableError,
)
from precision_plugin.policy import ENV_VAR, PrecisionPolicy, normalize_dtype
from precision_plugin.vllm.cascade import cascade_decision
from precision_plugin.vllm.engine import MARKER

log = logging.getLogger("precision_plugin")

_FIX = (
    f"restart the server with {ENV_VAR}={{dtype}} in its environment (the plugin's vLLM "
    f"general plugin then enforces it), or pass --dtype {{dtype}}"
)


@checked
def fetch_server_info(base_url: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET {base_url}/server_info?config_format=json``; returns the whole response."""
    try:
        info = get_json(base_url, "/server_info?config_format=json", engine="vLLM", timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise PrecisionConfigError(
                f"vLLM server at {base_url} has no /server_info endpoint, so its precision "
                f"cannot be verified. Fix: start it with VLLM_SERVER_DEV_MODE=1 (trl "
                f"vllm-serve does), or set policy vllm.verify_server=false."
            ) from None
        raise
    if not isinstance(info, Mapping) or not isinstance(info.get("vllm_config"), Mapping):
        raise ServerAnswerError(
            f"{base_url.rstrip('/')}/server_info answered without a 'vllm_config' object, which "
            f"vLLM's /server_info always has: another program answers there (an SGLang server "
            f"answers /server_info with its ServerArgs; check it with "
            f"precision_plugin.sglang.verify_server).",
            kind="other_program",
        )
    return dict(info)


def _server_config(server: Any) -> tuple[dict[str, Any], str | None, str]:
    """(vllm_config, server's vLLM version if reported, description) of ``server``."""
    if isinstance(server, Mapping):
        if "vllm_config" in server:
            version = (server.get("system_env") or {}).get("vllm_version")
            return dict(server["vllm_config"]), version, "vLLM server"
        return dict(server), None, "vLLM server"
    if isinstance(server, str):
        info = fetch_server_info(server)
        version = (info.get("system_env") or {}).get("vllm_version")
        return dict(info["vllm_config"]), version, f"vLLM server at {server}"
    where = getattr(server, "base_url", None)  # a TRL VLLMClient (the boundary checked it)
    return dict(server.get_server_info()), None, f"vLLM server at {where or repr(server)}"


_URL = server_url("vLLM", info_keys=("vllm_config", "model_config"), also="a TRL VLLMClient")


def _server(value: Any) -> Any:
    if not isinstance(value, (Mapping, str)) and not hasattr(value, "get_server_info"):
        raise Invalid("is not a TRL VLLMClient, a base URL or the /server_info JSON")
    return _URL(value)


def _engine(value: Any) -> Any:
    engine = getattr(value, "llm_engine", value)
    config = getattr(engine, "vllm_config", None)
    if getattr(config, "model_config", None) is None and not hasattr(engine, "model_config"):
        raise Invalid(
            "is not a vllm.LLM (or its llm_engine): it has no model_config; for a server use "
            "verify_server()"
        )
    return value


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return normalize_dtype(str(value))
    except PrecisionConfigError:
        return str(value)


@checked
def compare_runtime(
    *,
    dtype: Any,
    cascade_disabled: Any,
    cache_dtype: Any,
    policy: PrecisionPolicy,
    where: str,
    vllm_version: str | None = None,
) -> list[Finding]:
    """Findings for what an engine runs (dtype, cascade flag, KV-cache dtype) vs ``policy``."""
    findings: list[Finding] = []
    running = _dtype_name(dtype)
    fix = _FIX.format(dtype=policy.dtype)
    details = {"dtype": str(dtype), "disable_cascade_attn": cascade_disabled}
    if running is None:
        findings.append(Finding("vllm", "warning", f"{where} did not report its dtype.", fix=fix))
    elif running != policy.dtype:
        findings.append(
            Finding(
                "vllm",
                "error",
                f"{where} runs {dtype}, but the learner runs {policy.dtype}: rollouts and "
                f"training use different precisions, the mismatch the plugin exists to remove.",
                fix=fix,
                details=details,
            )
        )
    else:
        findings.append(Finding("vllm", "ok", f"{where} runs {policy.dtype}.", details=details))

    kv = str(cache_dtype or "auto").lower()
    if kv not in ("auto", policy.dtype) and not (kv == "half" and policy.is_fp16):
        findings.append(
            Finding(
                "vllm",
                "warning",
                f"{where} stores its KV cache as {cache_dtype}, not {policy.dtype}.",
                fix="start it with --kv-cache-dtype auto",
                details=details,
            )
        )

    version = vllm_version or (str(versions.installed_version("vllm") or "") or None)
    decision = cascade_decision(version, None, policy.vllm.cascade_guard) if version else None
    if decision is not None and decision.disables and cascade_disabled is False:
        findings.append(
            Finding(
                "vllm",
                "warning",
                f"{where} runs with cascade attention enabled; {decision.reason}",
                fix="restart it with the plugin's env var, or --disable-cascade-attn",
                details={**details, "cascade_decision": decision.action},
            )
        )
    return findings


@checked(server=Validator("a TRL VLLMClient, a base URL or the /server_info JSON", _server))
def verify_server(
    server: Any, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> list[Finding]:
    """Ask a running vLLM server what it runs and compare with ``policy`` (the learner's dtype).

    ``server`` is a TRL ``VLLMClient`` (its ``get_server_info()``), a base URL such as
    ``"http://localhost:8000"``, or the ``/server_info`` JSON. A dtype mismatch raises
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] under
    ``strictness="error"``, else it is logged as a warning; the findings are returned either way.
    """
    policy = resolve_policy(policy)
    try:
        config, version, where = _server_config(server)
    except ServerUnreachableError as exc:
        finding = Finding("vllm", "warning", str(exc), fix="start the server, or fix its URL")
        log.warning("%s Fix: %s.", finding.message, finding.fix)
        return [finding]
    except ServerAnswerError as exc:  # it answered, wrongly: an error under strictness="error"
        return unusable_answer("vllm", exc, policy)
    except PrecisionConfigError:
        raise
    except Exception as exc:
        finding = Finding(
            "vllm",
            "warning",
            f"Could not ask the vLLM server for its configuration ({type(exc).__name__}: {exc}).",
            fix="check that the server runs with VLLM_SERVER_DEV_MODE=1",
        )
        log.warning("%s Fix: %s.", finding.message, finding.fix)
        return [finding]
    model = config.get("model_config") or {}
    cache = config.get("cache_config") or {}
    findings = compare_runtime(
        dtype=model.get("dtype"),
        cascade_disabled=model.get("disable_cascade_attn"),
        cache_dtype=cache.get("cache_dtype"),
        policy=policy,
        where=where,
        vllm_version=version,
    )
    findings += _plugin_mark_findings(config.get("additional_config"), findings, where, False)
    return settle_findings(findings, policy)


def _plugin_mark_findings(
    additional_config: Any, findings: list[Finding], where: str, expected: bool
) -> list[Finding]:
    """A finding when an engine that reports its ``additional_config`` lacks the plugin's mark:
    the plugin did not run inside it (not asked to, excluded by ``VLLM_PLUGINS``, or its import
    failed, which vLLM logs once at ERROR and runs on). A warning when the plugin was
    ``expected`` there or the dtype is wrong; information otherwise."""
    if not isinstance(additional_config, Mapping) or MARKER in additional_config:
        return []
    wrong = any(f.status == "error" for f in findings)
    return [
        Finding(
            "vllm",
            "warning" if expected or wrong else "info",
            f"precision_plugin did not run inside the {where} (its additional_config has no "
            f"{MARKER!r} mark): nothing there enforced the policy. When the engine was started "
            f"with {ENV_VAR} set, vLLM failed to load the plugin (its log says 'Failed to load "
            f"plugin precision_plugin' at ERROR) or VLLM_PLUGINS excludes it.",
            fix="install precision_plugin in the engine's environment (precision-plugin doctor "
            "there names an import error), and let VLLM_PLUGINS name precision_plugin",
        )
    ]


@checked(llm=Validator("a vllm.LLM", _engine))
def verify_engine(
    llm: Any, policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> list[Finding]:
    """Compare a colocated ``vllm.LLM`` (e.g. TRL's ``trainer.vllm_generation.llm``) with
    ``policy``; same behaviour as [`verify_server`][precision_plugin.vllm.verify_server]."""
    policy = resolve_policy(policy)
    engine = getattr(llm, "llm_engine", llm)
    config = getattr(engine, "vllm_config", None)
    model = getattr(config, "model_config", None) or getattr(engine, "model_config", None)
    cache = getattr(config, "cache_config", None)
    findings = compare_runtime(
        dtype=getattr(model, "dtype", None),
        cascade_disabled=getattr(model, "disable_cascade_attn", None),
        cache_dtype=getattr(cache, "cache_dtype", None),
        policy=policy,
        where="colocated vLLM engine",
    )
    # Ambient on purpose: not the policy (that is ``policy``) but whether this process asked for
    # the plugin at all (enable() or PRECISION_PLUGIN), which a colocated engine then follows.
    expected = requested_policy() is not None
    findings += _plugin_mark_findings(
        getattr(config, "additional_config", None), findings, "colocated vLLM engine", expected
    )
    return settle_findings(findings, policy)
