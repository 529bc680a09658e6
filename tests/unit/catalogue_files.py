"""Bad inputs of issue 52, classes 1 and 2: files that are not plain files or are too big, and
paths the OS refuses. Each must end in the plugin's own error, one line naming the option or the
file, never a traceback, a hang or a ``MemoryError``.

Rows for the catalogue of ``tests/unit/test_bad_inputs.py`` (each a ``Case``'s keyword
arguments); ``rows(h)`` takes that module, for its helpers (``cli``, ``write``, ``apply``).
Every row runs :func:`isolated`: in a forked child with a memory cap and a time limit, so an
alias bomb or a named pipe that hangs fails its case instead of hanging the suite, and
``/dev/zero`` read to the end is a ``MemoryError`` in the child, not in the test run.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import resource
import select
import signal
import stat
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precision_plugin import PrecisionConfigError
from precision_plugin._base.userfiles import MAX_CONFIG_BYTES, MAX_DATA_BYTES
from precision_plugin.errors import PrecisionPluginError

#: Seconds a case may take in its child (the refusals take milliseconds; a hang takes for ever).
SECONDS = 60
#: Memory the child may add to what the test process already maps.
HEADROOM = 2 * 2**30

LONG_NAME = "n" * 300  # over NAME_MAX (255 bytes) on every common file system
#: A YAML "billion laughs": 9 levels of 10 aliases, 10**9 values once expanded.
ALIAS_BOMB = 'a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)
LIST_KEY = "? [a, b]\n: 1\n"
SELF_REFERENCE = "a: &x\n  b: *x\n"


def _cap_memory() -> None:
    try:
        with open("/proc/self/status") as status:
            mapped = next(
                int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize")
            )
        resource.setrlimit(resource.RLIMIT_AS, (mapped + HEADROOM, resource.RLIM_INFINITY))
    except (OSError, ValueError, StopIteration):
        pass  # no /proc or no limit to set: the time limit still holds


def _child(run: Callable[[Path], Any], tmp: Path, cli: bool, out: int) -> None:
    signal.alarm(SECONDS + 5)  # the default action ends the child if the parent cannot
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP's pool does not survive fork: torch's loops run inline
        torch.set_num_threads(1)
    _cap_memory()
    err = io.StringIO()
    try:
        if cli:
            sys.stderr = err
        value = run(tmp)
        payload: tuple[Any, ...] = ("returned", value if cli else repr(value), err.getvalue())
    except BaseException as exc:  # reported to the parent, which judges it
        payload = (
            "raised",
            type(exc).__module__,
            type(exc).__qualname__,
            str(exc),
            traceback.format_exc(),
            isinstance(exc, PrecisionPluginError),
        )
    data = pickle.dumps(payload)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]


def isolated(run: Callable[[Path], Any], seconds: float = SECONDS) -> Callable[[Path], Any]:
    """``run`` in a forked child with a memory cap; the parent gets its outcome back: the
    plugin's own error is raised again as itself, anything else (a traceback, a
    ``MemoryError``) fails the case with the child's traceback, and a child still running
    after ``seconds`` is killed and fails the case as a hang. A CLI case's stderr comes back."""
    cli = bool(getattr(run, "is_cli", False))

    def wrapped(tmp: Path) -> Any:
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the test run
            os.close(read_end)
            try:
                _child(run, tmp, cli, write_end)
            finally:
                os._exit(0)
        os.close(write_end)
        chunks, deadline = [], time.monotonic() + seconds
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read_end], [], [], left)[0]:
                    os.kill(pid, signal.SIGKILL)
                    raise AssertionError(f"hung: the case did not finish in {seconds} s")
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
        if not chunks:
            raise AssertionError(f"the case's process died without an answer (status {status})")
        payload = pickle.loads(b"".join(chunks))
        if payload[0] == "returned":
            if cli:
                sys.stderr.write(payload[2])
            return payload[1]
        _, module, qualname, message, trace, ours = payload
        if not ours:
            raise AssertionError(f"{module}.{qualname} instead of the plugin's error:\n{trace}")
        try:
            cls: Any = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            error = cls(message)
        except Exception:  # a class that cannot be rebuilt: the message stays
            error = PrecisionConfigError(message)
        raise error

    wrapped.is_cli = cli  # type: ignore[attr-defined]
    return wrapped


# -- what the cases read -------------------------------------------------------------------------


def text_file(name: str, data: str | bytes) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(path)

    return make


def fifo(name: str = "pipe.yaml") -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        return str(path)

    return make


def sparse(name: str, size: int) -> Callable[[Path], str]:
    """A file of ``size`` bytes that takes no disk (``truncate``)."""

    def make(tmp: Path) -> str:
        path = tmp / name
        with open(path, "wb") as handle:
            handle.truncate(size)
        return str(path)

    return make


def fixed(path: str) -> Callable[[Path], str]:
    return lambda tmp: path


def long_name(suffix: str = "") -> Callable[[Path], str]:
    return lambda tmp: str(tmp / f"{LONG_NAME}{suffix}")


def long_path(suffix: str = "") -> Callable[[Path], str]:
    """A path of more than 4096 bytes (``PATH_MAX``) of short names."""
    return lambda tmp: str(tmp / ("d/" * 2100)) + f"f{suffix}"


def folder(tmp: Path) -> str:
    return str(tmp)


def _block_device() -> str | None:
    for name in sorted(os.listdir("/dev")):
        path = f"/dev/{name}"
        try:
            if stat.S_ISBLK(os.stat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def no_block_device() -> str | None:
    return None if _block_device() else "no block device under /dev here"


def block_device(tmp: Path) -> str:
    path = _block_device()
    assert path is not None
    return path


# -- the entry points --------------------------------------------------------------------------


def load(program: str, make: Callable[[Path], str]) -> Callable[[Path], Any]:
    """``configs.load(path, DIALECTS[program])``: the verl/AReaL/slime/SGLang config reader."""

    def run(tmp: Path) -> Any:
        from precision_plugin._core.configs import DIALECTS
        from precision_plugin._core.configs import load as load_config

        return load_config(make(tmp), DIALECTS[program])

    return run


def read_mapping(program: str, data: Callable[[], Any]) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.configs import DIALECTS

        return DIALECTS[program].read_mapping(data(), "cfg.yaml")

    return run


def sglang_config(make: Callable[[Path], str]) -> Callable[[Path], Any]:
    """``sglang.check_server_args(["--config", path])`` (SGLang's ``--config`` file)."""

    def run(tmp: Path) -> Any:
        from precision_plugin import PrecisionPolicy
        from precision_plugin.sglang import check_server_args

        return check_server_args(["--config", make(tmp)], PrecisionPolicy(strictness="error"))

    return run


def slime_config(make: Callable[[Path], str]) -> Callable[[Path], Any]:
    """``sglang.check_slime_args(["--sglang-config", path])``."""

    def run(tmp: Path) -> Any:
        from precision_plugin import PrecisionPolicy
        from precision_plugin.slime import check_slime_args

        return check_slime_args(
            ["--sglang-config", make(tmp)], PrecisionPolicy(strictness="error"), environ={}
        )

    return run


def model_config(make: Callable[[Path], str]) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.vllm import check_model_config

        return check_model_config(make(tmp))

    return run


def probe_api(name: str, make: Callable[[Path], Any]) -> Callable[[Path], Any]:
    """``precision_plugin.probe.<name>(make(tmp))`` (``read_prompts_file``, ``check_model_dir``,
    ``load_causal_lm`` with the device ``cpu``)."""

    def run(tmp: Path) -> Any:
        from precision_plugin import probe

        func = getattr(probe, name)
        return func(make(tmp), "cpu") if name == "load_causal_lm" else func(make(tmp))

    return run


def find_gguf(make: Callable[[Path], str]) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.probe.gguf import find_gguf as find

        return find(make(tmp))

    return run


def ds_translate(data: Callable[[], Any]) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.deepspeed import translate

        return translate(data(), None)

    return run


def sglang_kwargs(data: Callable[[], Any]) -> Callable[[Path], Any]:
    """``sglang.check_server_args(data())``: the keyword arguments of ``sglang.Engine``."""

    def run(tmp: Path) -> Any:
        from precision_plugin.sglang import check_server_args

        return check_server_args(data())

    return run


def deep_dict(levels: int = 10_000) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    return root


def cyclic_dict() -> dict[str, Any]:
    data: dict[str, Any] = {"actor_rollout_ref": {"rollout": {"dtype": "float16"}}}
    data["actor_rollout_ref"]["self"] = data
    return data


def shared_bomb() -> dict[str, Any]:
    """A Python "billion laughs": 9 levels of 10 references to one mapping."""
    level: Any = {str(i): "x" for i in range(10)}
    for _ in range(8):
        level = {str(i): level for i in range(10)}
    return {"a": level}


def rows(h: Any) -> list[dict[str, Any]]:
    """The rows, built with the helpers of ``tests/unit/test_bad_inputs.py`` (``h``)."""
    out: list[dict[str, Any]] = []

    def bad(id: str, cls: str, run: Any, *names: str, skip: Any = None) -> None:
        row = {"id": id, "cls": cls, "run": isolated(run), "names": names}
        if skip is not None:
            row["skip"] = skip
        out.append(row)

    def ds(make: Callable[[Path], Any]) -> Callable[[Path], Any]:
        return h.apply(make)

    def cli(*args: Any) -> Callable[[Path], Any]:
        return h.cli(*args)

    bomb = text_file("bomb.yaml", ALIAS_BOMB)
    # -- class 1: files that are not plain files, or too big -------------------------------------
    for program in ("verl", "AReaL", "slime"):
        bad(f"{program} config alias bomb", "files", load(program, bomb), "bomb.yaml", "alias")
    bad("sglang --config alias bomb", "files", sglang_config(bomb), "--config", "alias")
    bad("slime --sglang-config alias bomb", "files", slime_config(bomb), "--sglang-config", "alias")
    bad("verl config fifo", "files", load("verl", fifo()), "pipe.yaml", "named pipe")
    bad("sglang --config fifo", "files", sglang_config(fifo()), "--config", "named pipe")
    bad("ds apply_config fifo", "files", ds(fifo("ds.json")), "ds.json", "named pipe")
    bad("verl config /dev/zero", "files", load("verl", fixed("/dev/zero")), "/dev/zero", "device")
    bad("ds apply_config /dev/zero", "files", ds(fixed("/dev/zero")), "/dev/zero", "device")
    bad("verl config /dev/null", "files", load("verl", fixed("/dev/null")), "/dev/null", "device")
    bad(
        "verl config block device",
        "files",
        load("verl", block_device),
        "block device",
        skip=no_block_device,
    )
    bad("verl config folder", "files", load("verl", folder), "is a folder")
    bad("sglang --config folder", "files", sglang_config(folder), "--config", "is a folder")
    bad(
        "sglang --config not UTF-8",
        "files",
        sglang_config(text_file("server.yaml", b"dtype: f\xe9\n")),
        "--config",
        "not UTF-8",
        "byte 0xe9 at offset 8",
    )
    bad(
        "verl config list as key",
        "files",
        load("verl", text_file("ppo.yaml", LIST_KEY)),
        "ppo.yaml",
        "list as a key",
    )
    bad(
        "sglang --config list as key",
        "files",
        sglang_config(text_file("server.yaml", LIST_KEY)),
        "--config",
        "list as a key",
    )
    bad(
        "verl config self-reference",
        "files",
        load("verl", text_file("ppo.yaml", SELF_REFERENCE)),
        "ppo.yaml",
        "&x inside itself",
    )
    bad(
        "sglang --config self-reference",
        "files",
        sglang_config(text_file("server.yaml", SELF_REFERENCE)),
        "--config",
        "inside itself",
    )
    bad(
        "verl read_mapping self-reference",
        "files",
        read_mapping("verl", cyclic_dict),
        "cfg.yaml",
        "contains itself",
    )
    bad(
        "verl read_mapping shared bomb",
        "files",
        read_mapping("verl", shared_bomb),
        "cfg.yaml",
        "1,000,000 values",
    )
    bad(
        "ds apply_config self-reference dict",
        "files",
        ds(lambda t: cyclic_dict()),
        "DeepSpeed config (cfg",
        "contains itself",
    )
    bad(
        "ds apply_config 10,000 deep dict",
        "files",
        ds(lambda t: deep_dict()),
        "DeepSpeed config (cfg",
        "nests deeper",
    )
    bad(
        "ds translate 10,000 deep dict",
        "files",
        ds_translate(deep_dict),
        "DeepSpeed config (cfg",
        "nests deeper",
    )
    bad(
        "sglang check_server_args self-reference dict",
        "files",
        sglang_kwargs(lambda: {"model_path": "m", **cyclic_dict()}),
        "(args)",
        "contains itself",
    )
    bad(
        "verl config over the size limit",
        "files",
        load("verl", sparse("ppo.yaml", MAX_CONFIG_BYTES + 1)),
        "ppo.yaml",
        "over the limit",
    )
    bad(
        "ds config over the size limit",
        "files",
        ds(sparse("ds.json", MAX_CONFIG_BYTES + 1)),
        "ds.json",
        "over the limit",
    )
    bad(
        "check_model_config fifo",
        "files",
        model_config(fifo("m/config.json")),
        "config.json",
        "named pipe",
    )
    bad(
        "cli probe --prompts fifo",
        "files",
        cli("probe", "--prompts", fifo("p.txt")),
        "p.txt",
        "named pipe",
    )
    bad(
        "cli probe --prompts /dev/zero",
        "files",
        cli("probe", "--prompts", "/dev/zero"),
        "/dev/zero",
        "device",
    )
    bad(
        "cli probe --prompts over the size limit",
        "files",
        cli("probe", "--prompts", sparse("p.txt", MAX_DATA_BYTES + 1)),
        "p.txt",
        "over the limit",
    )
    bad(
        "probe read_prompts_file fifo",
        "files",
        probe_api("read_prompts_file", fifo("p.txt")),
        "prompts:",
        "named pipe",
    )
    bad(
        "probe read_prompts_file /dev/zero",
        "files",
        probe_api("read_prompts_file", fixed("/dev/zero")),
        "prompts:",
        "device",
    )
    bad(
        "gguf-checkpoint source fifo",
        "files",
        find_gguf(fifo("m.gguf")),
        "source:",
        "named pipe",
    )
    # -- class 2: paths the OS refuses -----------------------------------------------------------
    for command, option, suffix in (
        ("probe", "--json", ".json"),
        ("probe", "--plot", ".png"),
        ("probe", "--attribution-plot", ".png"),
        ("sanity", "--json", ".json"),
        ("sanity", "--plot", ".png"),
    ):
        bad(
            f"cli {command} {option} name over 255 bytes",
            "paths",
            cli(command, option, long_name(suffix)),
            option,
            "over the file system's limit",
        )
    bad(
        "cli probe --model name over 255 bytes",
        "paths",
        cli("probe", "--model", long_name()),
        "--model",
        "over the file system's limit",
    )
    bad(
        "cli probe --prompts name over 255 bytes",
        "paths",
        cli("probe", "--prompts", long_name(".txt")),
        "prompts:",
        "over the file system's limit",
    )
    bad(
        "probe read_prompts_file NUL byte",
        "paths",
        probe_api("read_prompts_file", fixed("p\0.txt")),
        "prompts:",
        "NUL",
    )
    bad(
        "probe check_model_dir name over 255 bytes",
        "paths",
        probe_api("check_model_dir", long_name()),
        "model",
        "over the file system's limit",
    )
    bad(
        "probe load_causal_lm a Hub id (never downloaded)",
        "paths",
        probe_api("load_causal_lm", fixed("no-such-owner/no-such-model")),
        "'no-such-owner/no-such-model'",
        "downloads nothing",
    )
    bad(
        "gguf-checkpoint source name over 255 bytes",
        "paths",
        find_gguf(long_name(".gguf")),
        "source",
        "over the file system's limit",
    )
    bad("cli probe --json NUL byte", "paths", cli("probe", "--json", "a\0b.json"), "--json", "NUL")
    bad("cli sanity --json NUL byte", "paths", cli("sanity", "--json", "a\0b.json"), "NUL")
    bad("cli probe --plot NUL byte", "paths", cli("probe", "--plot", "a\0b.png"), "--plot", "NUL")
    bad(
        "cli probe --json path over PATH_MAX",
        "paths",
        cli("probe", "--json", long_path(".json")),
        "--json",
        "limit of 4095 bytes per path",
    )
    bad("verl config NUL byte", "paths", load("verl", fixed("ppo\0.yaml")), "verl", "NUL byte")
    bad(
        "verl config name over 255 bytes",
        "paths",
        load("verl", long_name(".yaml")),
        "verl",
        "over the file system's limit",
    )
    bad(
        "verl config path over PATH_MAX",
        "paths",
        load("verl", long_path(".yaml")),
        "verl",
        "bytes per path",
    )
    bad("ds apply_config NUL byte", "paths", ds(fixed("ds\0.json")), "DeepSpeed config", "NUL")
    bad(
        "ds apply_config name over 255 bytes",
        "paths",
        ds(long_name(".json")),
        "DeepSpeed config",
        "over the file system's limit",
    )
    bad(
        "sglang --config name over 255 bytes",
        "paths",
        sglang_config(long_name(".yaml")),
        "--config",
        "over the file system's limit",
    )
    bad(
        "check_model_config name over 255 bytes",
        "paths",
        model_config(long_name()),
        "check_model_config",
        "over the file system's limit",
    )
    return out
