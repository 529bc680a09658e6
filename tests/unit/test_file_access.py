"""One reader, one writer: no module of ``precision_plugin`` opens a file itself, except the reader
(``userfiles.py``) and the writer (``outputs.py``), and the few places below that open a path
the package owns (its own source, another installed package's files, ``os.devnull``).

The scan reads every module with ``ast`` and lists each call that opens, reads or writes a path:
``open(...)``, ``os.open``/``io.open``/``Path.open``, ``.read_text()``, ``.read_bytes()``,
``.write_text()``, ``.write_bytes()``, ``yaml.safe_load``/``yaml.load``/``json.load``/
``json.dump`` on a stream, ``torch.load``/``torch.save`` and ``.savefig()``. A new call fails
here until it goes through the reader or the writer (or is justified below), and a fixed
pending entry must be deleted (the pending list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "precision_plugin"

#: The one reader of files a user names, and the one checked writer.
READER_AND_WRITER = {"_base/userfiles.py", "_base/outputs.py"}

#: (module, call) -> why it may open a path itself: paths the package owns or finds, never one
#: a user gave. Keep this short.
ALLOWED: dict[tuple[str, str], str] = {
    ("_base/layers.py", "read_text"): "the package's own source files (the layer table's AST scan)",
    ("vllm/invariance.py", "read_text"): "the installed vLLM package's own source files",
    ("openrlhf/installed.py", "read_text"): "the installed OpenRLHF package's own source files",
    ("verl/doctor.py", "read_text"): "the installed verl package's default config "
    "(_generated_ppo_trainer.yaml), found through importlib",
    ("verl/doctor.py", "safe_load"): "parses that packaged default config (text already read)",
    ("cli/process.py", "os.open"): "os.devnull, to silence a closed stdout",
    ("deepspeed/device.py", "open"): "torch's own build.ninja in its extension build folder, "
    "to see which DeepSpeed built the CPU op",
    ("_base/provenance.py", "open"): "/proc/cpuinfo, the kernel's description of the CPU",
    ("sanity/plot.py", "savefig"): "draws into the temporary path the checked writer gives it "
    "(cli/output.write -> outputs.write_with)",
    ("probe/plot.py", "savefig"): "draws into the temporary path the checked writer gives it "
    "(cli/output.write -> outputs.write_with)",
}

#: Calls that still open a path a user gave, each with what moving it takes (issue 52). A
#: ratchet, not an allow-list: it can only shrink.
PENDING: dict[tuple[str, str], str] = {
    ("probe/attribution/plot.py", "savefig"): "write_attribution_plot: through "
    "outputs.write_with, as --plot is (the path is checked before the run)",
}

_ATTRIBUTES = {"read_text", "read_bytes", "write_text", "write_bytes", "savefig", "open"}
_MODULE_CALLS = {
    ("yaml", "safe_load"),
    ("yaml", "load"),
    ("json", "load"),
    ("json", "dump"),
    ("torch", "load"),
    ("torch", "save"),
}


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        return "open"
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if owner in ("userfiles", "outputs"):  # the reader and the writer themselves
        return None
    if owner in ("os", "io") and func.attr == "open":
        return f"{owner}.open"
    if (owner, func.attr) in _MODULE_CALLS:
        return func.attr
    if func.attr in _ATTRIBUTES and owner not in ("yaml", "json", "torch"):
        return func.attr
    return None


def file_calls(root: Path = PACKAGE) -> dict[tuple[str, str], list[int]]:
    """(module path relative to the package, call) -> line numbers, outside the reader/writer."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative in READER_AND_WRITER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _call_name(node)) is not None:
                found.setdefault((relative, name), []).append(node.lineno)
    return found


def test_no_module_opens_a_path_outside_the_reader_and_the_writer() -> None:
    found = file_calls()
    unexplained = {
        f"precision_plugin/{module}:{lines[0]}: {call}(...)"
        for (module, call), lines in found.items()
        if (module, call) not in ALLOWED and (module, call) not in PENDING
    }
    assert not unexplained, (
        "read user-given files with precision_plugin._base.userfiles and write outputs with "
        f"precision_plugin._base.outputs: {sorted(unexplained)}"
    )


def test_the_pending_list_only_shrinks() -> None:
    stale = set(PENDING) - set(file_calls())
    assert not stale, f"PENDING names calls the source no longer makes: delete {sorted(stale)}"


def test_the_allow_list_names_modules_that_exist() -> None:
    gone = {module for module, _ in ALLOWED if not (PACKAGE / module).is_file()}
    assert not gone, f"ALLOWED names modules that are gone: {sorted(gone)}"


def test_the_scan_sees_every_kind_of_call(tmp_path: Path) -> None:
    """A planted module with each kind of call is found, call by call (a scan that sees nothing
    cannot pass the tests above)."""
    (tmp_path / "planted.py").write_text(
        "import json, os, io, yaml, torch\n"
        "from pathlib import Path\n"
        "open('a')\nos.open('a', 0)\nio.open('a')\nPath('a').open()\n"
        "Path('a').read_text()\nPath('a').read_bytes()\nPath('a').write_text('x')\n"
        "Path('a').write_bytes(b'x')\nyaml.safe_load(open('a'))\nyaml.load('x')\n"
        "json.load(f)\njson.dump({}, f)\ntorch.load('a')\ntorch.save({}, 'a')\n"
        "fig.savefig('a.png')\njson.loads('{}')\nyaml.safe_dump({})\n"
    )
    (tmp_path / "_base").mkdir()
    (tmp_path / "_base" / "userfiles.py").write_text("open('a')\n")
    assert {call for _, call in file_calls(tmp_path)} == {
        "open", "os.open", "io.open", "read_text", "read_bytes", "write_text", "write_bytes",
        "safe_load", "load", "dump", "save", "savefig",
    }  # fmt: skip
    assert ("_base/userfiles.py", "open") not in file_calls(tmp_path)
