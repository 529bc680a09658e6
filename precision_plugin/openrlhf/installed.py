"""What the installed OpenRLHF does, read from its source files without importing it.

Importing ``openrlhf.trainer.ray`` imports vLLM, Ray and DeepSpeed, and its models need
flash-attn; the checks need none of that. The facts are taken from the syntax tree of the
installed files: the flags its ``train_ppo_ray`` parser declares, the dtype its
``create_vllm_engines`` hard-codes, and what its weight sync does with the learner's dtype (the
released 0.11.x assert that it equals the engine's; the open OpenRLHF#1348 would cast the
learner's weights to bf16 first, which an fp16 learner would not notice).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from precision_plugin._base import versions
from precision_plugin._base.boundary import checked
from precision_plugin._base.dtypes import spellings

PARSER_FILE = "cli/train_ppo_ray.py"
ENGINE_FILE = "trainer/ray/vllm_engine.py"
WORKER_FILE = "trainer/ray/vllm_worker_wrap.py"
ACTOR_FILE = "trainer/ray/ppo_actor.py"

#: The ``torch.<name>`` attributes (and strings) read as a dtype, through the one vocabulary.
_TORCH_DTYPES = spellings(("bfloat16", "float16", "half"))


@checked
@dataclass(frozen=True)
class WeightSync:
    """What the weight sync from the learner to the vLLM engines does with dtypes.

    ``asserts``: the engine side asserts the sent dtype equals its own (a mismatch fails at the
    first sync). ``casts_to``: the learner casts the weights before sending them, to a fixed
    dtype (``"bfloat16"``), to a dtype read at run time (``"runtime"``), or not at all
    (``None``).
    """

    asserts: bool
    casts_to: str | None = None

    def describe(self) -> str:
        """One clause for messages."""
        if self.casts_to in _TORCH_DTYPES.values():
            return f"casts the learner's weights to {self.casts_to} before sending them"
        if self.casts_to == "runtime":
            return "casts the learner's weights to a dtype chosen at run time before sending them"
        if self.asserts:
            return "sends the learner's dtype and asserts it equals the engine's"
        return "sends the learner's dtype unchecked"


#: Every released OpenRLHF from 0.9.10 to 0.11.2 (read from the wheels).
RELEASED_WEIGHT_SYNC = WeightSync(asserts=True, casts_to=None)


@dataclass(frozen=True)
class Installed:
    """The installed OpenRLHF: version, folder, parser flags, engine dtype, weight sync."""

    version: Version
    path: Path
    flags: frozenset[str]
    engine_dtype: str | None
    weight_sync: WeightSync


def package_dir() -> Path | None:
    """The installed ``openrlhf`` package folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("openrlhf")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _tree(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def parser_flags(text: str) -> frozenset[str]:
    """The ``--flags`` a module's ``add_argument`` calls declare (literal names only)."""
    tree = _tree(text)
    found: set[str] = set()
    for node in ast.walk(tree) if tree else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    found.add(str(arg.value))
    return frozenset(found)


def _dtype_name(node: ast.AST) -> str | None:
    """``torch.bfloat16`` / ``"bfloat16"`` -> ``bfloat16``; anything else ``None``."""
    if isinstance(node, ast.Attribute) and node.attr in _TORCH_DTYPES:
        return _TORCH_DTYPES[node.attr]
    if isinstance(node, ast.Constant) and str(node.value) in _TORCH_DTYPES:
        return _TORCH_DTYPES[str(node.value)]
    return None


def engine_dtype(text: str) -> str | None:
    """The literal ``"dtype"`` value ``create_vllm_engines`` gives its engines, or ``None``."""
    tree = _tree(text)
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.FunctionDef) and node.name == "create_vllm_engines":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict):
                    for key, value in zip(sub.keys, sub.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "dtype":
                            return _dtype_name(value) or (
                                str(value.value) if isinstance(value, ast.Constant) else None
                            )
    return None


def _asserts_dtype(tree: ast.Module) -> bool:
    """An ``assert`` comparing a ``dtype`` with ``...model_config.dtype``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            text = ast.unparse(node.test)
            if "dtype" in text and "model_config.dtype" in text:
                return True
    return False


def _cast_in(function: ast.AST) -> str | None:
    """The dtype a ``.to(...)`` / ``.bfloat16()`` / ``.half()`` call in ``function`` casts to."""
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in ("bfloat16", "half") and not node.args:
            return _TORCH_DTYPES[node.func.attr]
        if node.func.attr != "to":
            continue
        for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]:
            named = _dtype_name(arg)
            if named is not None:
                return named
            if "dtype" in ast.unparse(arg):
                return "runtime"
    return None


def weight_sync(worker_text: str, actor_text: str) -> WeightSync:
    """Classify the weight sync from ``vllm_worker_wrap.py`` and ``ppo_actor.py`` sources."""
    worker = _tree(worker_text)
    actor = _tree(actor_text)
    asserts = bool(worker and _asserts_dtype(worker))
    casts_to = None
    for node in ast.walk(actor) if actor else ():
        if isinstance(node, ast.FunctionDef) and node.name == "broadcast_to_vllm":
            casts_to = casts_to or _cast_in(node)
    return WeightSync(asserts=asserts, casts_to=casts_to)


def _read(root: Path, relative: str) -> str:
    try:
        return (root / relative).read_text(encoding="utf-8")
    except OSError:
        return ""


@functools.cache
@checked
def installed() -> Installed | None:
    """The installed OpenRLHF (cached; ``installed.cache_clear()`` after installing), or
    ``None``."""
    info = versions.package_info("openrlhf")
    root = package_dir()
    if info is None or root is None:
        return None
    return Installed(
        version=info.version,
        path=root,
        flags=parser_flags(_read(root, PARSER_FILE)),
        engine_dtype=engine_dtype(_read(root, ENGINE_FILE)),
        weight_sync=weight_sync(_read(root, WORKER_FILE), _read(root, ACTOR_FILE)),
    )
