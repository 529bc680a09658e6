"""Which attention backends the installed vLLM's batch-invariant mode supports, and whether the
one a user selected is among them (``batch_invariant='on'``).

vLLM 0.33 declares it per backend class: ``AttentionBackend.supports_batch_invariance()``
(``False`` by default; ``True`` in FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION, TRITON_MLA,
FLASH_ATTN_MLA and their subclasses), and its selector refuses any other backend with
``VLLM_BATCH_INVARIANT=1`` only when the engine starts, on the GPU. This module reads the same
declaration from vLLM's source without importing the backends (they load CUDA kernels): each
``AttentionBackendEnum`` member's class, following its bases through vLLM's modules. A vLLM
whose backends do not declare it (older versions) gives ``None``: nothing is checked.
A backend is selected by ``LLM(attention_backend=...)``, ``attention_config={"backend": ...}``
or, in older versions, the ``VLLM_ATTENTION_BACKEND`` variable.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.report import Finding
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: vLLM's registry of attention backends and the interface that declares the capability.
REGISTRY = "v1/attention/backends/registry.py"
INTERFACE = "v1/attention/backend.py"
ENUM = "AttentionBackendEnum"
METHOD = "supports_batch_invariance"
ENV = "VLLM_ATTENTION_BACKEND"


def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")  # a top-level name: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=64)
def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _module_file(root: Path, dotted: str) -> Path:
    parts = dotted.split(".")[1:]  # drop "vllm"
    return root.joinpath(*parts).with_suffix(".py")


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` in ``module`` reads (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.rsplit(".", node.level)[0]
    return f"{package}.{node.module}" if node.module else package


def _says(root: Path, module: str, name: str, depth: int = 0) -> bool:
    """Whether class ``name`` of vLLM module ``module`` returns True from METHOD (its own
    definition, else its bases', else the interface's False)."""
    tree = _parse(_module_file(root, module))
    if tree is None or depth > 8:
        return False
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        return False
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == METHOD:
            returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
            return bool(returns) and all(
                isinstance(v, ast.Constant) and v.value is True for v in returns
            )
    imported = {
        alias.asname or alias.name: (_absolute(module, node), alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        if any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
            if _says(root, module, base.id, depth + 1):
                return True
        elif base.id in imported:
            source, original = imported[base.id]
            if source.startswith("vllm.") and _says(root, source, original, depth + 1):
                return True
    return False


@checked
def invariant_backends() -> frozenset[str] | None:
    """Names of the installed vLLM's attention backends whose class declares
    ``supports_batch_invariance() -> True``; ``None`` without vLLM or when its backends declare
    no such capability (read from vLLM's source; no backend is imported)."""
    root = _vllm_root()
    if root is None or METHOD not in (
        (root / INTERFACE).read_text() if (root / INTERFACE).is_file() else ""
    ):
        return None
    tree = _parse(root / REGISTRY)
    enum = tree and next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ENUM), None
    )
    if not enum:
        return None
    out = set()
    for node in enum.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)):
            continue
        path = node.value.value
        if not isinstance(path, str) or "." not in path:
            continue
        module, _, cls = path.rpartition(".")
        if _says(root, module, cls):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(out)


@checked
def selected_backend(
    engine_kwargs: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The attention backend a user selected: ``attention_backend`` or
    ``attention_config["backend"]`` in the engine's kwargs, else ``VLLM_ATTENTION_BACKEND``
    (``None``: vLLM chooses; ``auto`` counts as none)."""
    kwargs = engine_kwargs or {}
    config = kwargs.get("attention_config")
    found = kwargs.get("attention_backend")
    if found is None and config is not None:
        found = (
            config.get("backend")
            if isinstance(config, Mapping)
            else getattr(config, "backend", None)
        )
    if found is None and environ is not None:
        found = environ.get(ENV) or None
    if found is None:
        return None
    name = str(getattr(found, "name", found)).strip().upper()
    return None if name in ("", "AUTO") else name


@checked
def attention_backend_findings(
    policy: PrecisionPolicy, backend: str | None, supported: frozenset[str] | None
) -> list[Finding]:
    """A warning when ``batch_invariant='on'`` and ``backend`` is not one the installed vLLM's
    batch-invariant mode supports (nothing with no selection or no declaration to read);
    ``strictness='error'`` raises ``PrecisionConfigError`` instead."""
    if policy.batch_invariant != "on" or backend is None or supported is None:
        return []
    if backend in supported:
        return []
    message = (
        f"batch_invariant='on' with attention backend {backend}: the installed vLLM's "
        f"batch-invariant mode supports only {', '.join(sorted(supported))} (their "
        f"supports_batch_invariance()); vLLM refuses {backend} when the engine starts"
    )
    fix = f"select one of {', '.join(sorted(supported))}, or leave the backend to vLLM"
    if policy.strictness == "error":
        raise PrecisionConfigError(f"precision_plugin: {message}. Fix: {fix}.")
    return [Finding("vllm", "warning", message, fix=fix)]


@checked
def check_attention_backend(
    policy: PrecisionPolicy,
    engine_kwargs: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    """[`attention_backend_findings`][precision_plugin.vllm.invariance.attention_backend_findings]
    for the backend selected in ``engine_kwargs``/``environ`` and the installed vLLM; each
    finding is also logged as a warning."""
    if policy.batch_invariant != "on":
        return []
    backend = selected_backend(engine_kwargs, environ)
    if backend is None:
        return []
    found = attention_backend_findings(policy, backend, invariant_backends())
    for finding in found:
        log.warning("precision_plugin: %s. Fix: %s.", finding.message, finding.fix)
    return found
