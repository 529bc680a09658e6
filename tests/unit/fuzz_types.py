"""The type-driven fuzzer of the public API: adversarial values derived from each parameter's
annotation (never from a hand-written row), each call judged by one oracle, in a forked child
with a memory cap and a time limit.

Values of the *right* type that a function may still not expect (``test_public_api.py`` sends
wrong types and out-of-range values of declared bounds):

- ``float``: NaN, ±inf, -1, 0, 1e308, 1e-320 (subnormal);
- ``int``: -1, 0, 2**70, ``True``;
- ``str``: empty, whitespace, non-ASCII digits, a NUL byte;
- sequences: empty, one element, NaN inside, ragged rows (of a sequence of sequences), and a
  length that differs from a sibling sequence parameter's;
- paths (a ``PathLike`` arm, or a ``str`` parameter named like a path): a 300-byte name, a NUL
  byte, a folder, a FIFO, ``/dev/zero``, a non-UTF-8 file, a file over the size limit;
- mappings: empty, a self-reference, 10,000-deep nesting, a tuple as a key;
- tensors: empty, NaN or inf inside, 0-dim, 3-dim, integer;
- a ``Literal``: a string that is none of its choices, and a choice in upper case;
- ``Any`` and unions: the union of their arms' values (``Any``: a sample of every kind).

The oracle: the call returns, or raises the plugin's own error (``PrecisionPluginError``) in one
line that names the parameter. Any other exception, a hang, a crash or a multi-line or anonymous
refusal is a finding, with the call that reproduces it. Entry points that would start a model
run, a server or a network call (:data:`BOUNDARY_ONLY`), and public methods (called without an
instance), are fuzzed up to their boundary check: ``Boundary.check`` must refuse or accept.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
import select
import signal
import sys
import time
import traceback
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_plugin._base.boundary.typecheck import _arms
from precision_plugin.errors import PrecisionPluginError
from tests.unit.catalogue_files import _cap_memory as cap_memory
from tests.unit.catalogue_files import deep_dict

#: Seconds one call may take in the child before it is a hang.
CALL_SECONDS = 10
#: Entry points fuzzed up to their boundary check only: past it they start a model run, a
#: server, a subprocess or a network call (each must refuse bad values before any work).
BOUNDARY_ONLY = frozenset(
    {
        "run_probe",
        "precision_plugin.probe.run_probe",
        "run_sanity",
        "precision_plugin.sanity.run_sanity",
        "verify_server",
        "precision_plugin.vllm.verify_server",
        "precision_plugin.sglang.verify_server",
    }
)
#: Parameter names that hold a path when typed ``str``.
PATHLIKE_NAMES = ("path", "file", "folder", "dir", "config", "model", "prompts", "output")

NAN = math.nan
FLOATS: tuple[tuple[str, Any], ...] = (
    ("nan", NAN), ("inf", math.inf), ("-inf", -math.inf), ("-1.0", -1.0), ("0.0", 0.0),
    ("1e308", 1e308), ("1e-320", 1e-320),
)  # fmt: skip
INTS: tuple[tuple[str, Any], ...] = (("-1", -1), ("0", 0), ("2**70", 2**70), ("True", True))
STRS: tuple[tuple[str, Any], ...] = (
    ("''", ""), ("whitespace", "  \t"), ("non-ASCII digits", "١٢٣"), ("NUL byte", "a\x00b"),
)  # fmt: skip


def _self_reference() -> dict[str, Any]:
    loop: dict[str, Any] = {"dtype": "float16"}
    loop["self"] = loop
    return loop


def mappings() -> tuple[tuple[str, Any], ...]:
    return (
        ("{}", {}),
        ("self-reference", _self_reference()),
        ("10,000 deep", deep_dict()),
        ("tuple key", {("a", "b"): 1}),
    )


def paths(tmp: Path) -> tuple[tuple[str, Any], ...]:
    """Paths the OS or a reader must refuse, made under ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    fifo = tmp / "pipe"
    if not fifo.exists():
        os.mkfifo(fifo)
    latin = tmp / "latin1.json"
    latin.write_bytes(b'{"dtype": "fl\xe9at16"}')
    big = tmp / "big.json"
    if not big.exists():
        with open(big, "wb") as handle:  # sparse: no disk used
            handle.truncate(300 * 2**20)
    return (
        ("300-byte name", str(tmp / ("n" * 300))),
        ("NUL byte", str(tmp / "a\x00b")),
        ("folder", str(tmp)),
        ("FIFO", str(fifo)),
        ("/dev/zero", "/dev/zero"),
        ("non-UTF-8 file", str(latin)),
        ("300 MiB file", str(big)),
    )


def _origin(arm: Any) -> Any:
    return typing.get_origin(arm) or arm


def _is_sequence(arm: Any) -> bool:
    origin = _origin(arm)
    return (
        isinstance(origin, type)
        and origin not in (str, bytes)
        and issubclass(origin, Iterable)
        and not issubclass(origin, Mapping)
        and not _is_tensor(arm)
    )


def _is_tensor(arm: Any) -> bool:
    return getattr(arm, "__module__", "") == "torch" and getattr(arm, "__name__", "") == "Tensor"


def tensors() -> tuple[tuple[str, Any], ...]:
    """Right-typed tensors a function may not expect."""
    import torch

    return (
        ("empty tensor", torch.empty(0)),
        ("tensor [nan]", torch.tensor([NAN])),
        ("tensor [inf]", torch.tensor([math.inf, 1.0])),
        ("0-dim tensor", torch.tensor(1.0)),
        ("3-dim tensor", torch.zeros(2, 3, 4)),
        ("int64 tensor", torch.tensor([1, 2])),
    )


def outside(arm: Any) -> tuple[tuple[str, Any], ...]:
    """A value of the ``Literal``'s type that is none of its choices."""
    choices = typing.get_args(arm)
    if choices and all(isinstance(c, str) for c in choices):
        return (("not a choice", "not-a-choice"), ("a choice's case", str(choices[0]).upper()))
    if choices and all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        return (("not a choice", max(choices) + 1),)
    return ()


def _is_mapping(arm: Any) -> bool:
    origin = _origin(arm)
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _is_sequence_value(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value)


def _element(arm: Any) -> Any:
    args = typing.get_args(arm)
    return args[0] if args else Any


def sequences(arm: Any) -> tuple[tuple[str, Any], ...]:
    """Right-typed sequences that a function may not expect."""
    element = _element(arm)
    inner = [a for a in _arms(element)]
    out: list[tuple[str, Any]] = [("[]", [])]
    if float in inner or element is Any:
        out += [("[nan]", [NAN]), ("[inf, 1.0]", [math.inf, 1.0]), ("[1.0]", [1.0])]
    if int in inner:
        out += [("[-1]", [-1]), ("[2**70]", [2**70])]
    if any(_is_sequence(a) for a in inner):
        out += [("ragged rows", [[-1.0], [-1.0, -2.0]]), ("[[]]", [[]]), ("[[nan]]", [[NAN]])]
    if str in inner:
        out += [("['']", [""])]
    if _origin(arm) is tuple:
        out = [(label, tuple(value)) for label, value in out]
    return tuple(out)


def anything() -> tuple[tuple[str, Any], ...]:
    """What an ``Any`` parameter is sent: one value of each kind."""
    return (
        ("nan", NAN),
        ("-1", -1),
        ("2**70", 2**70),
        ("''", ""),
        ("[]", []),
        ("ragged rows", [[1.0], [1.0, 2.0]]),
        ("self-reference", _self_reference()),
    )


def adversarial(name: str, hint: Any, tmp: Path | None) -> list[tuple[str, Any]]:
    """The values ``name: hint`` is fuzzed with (label, value), derived from the annotation
    (``tmp``: the folder the path values are made in; ``None``: their labels only)."""
    out: list[tuple[str, Any]] = []
    arms = _arms(hint)
    pathlike = any(word in name.lower() for word in PATHLIKE_NAMES)
    for arm in arms:
        origin = _origin(arm)
        if arm is Any:
            out += anything()
        elif origin is typing.Literal:
            out += outside(arm)
        elif origin is bool or arm is type(None):
            continue
        elif _is_tensor(arm):
            out += tensors()
        elif origin is float:
            out += FLOATS
        elif origin is int:
            out += INTS
        elif origin is str:
            out += STRS
            if pathlike:
                out += paths(tmp) if tmp is not None else [("a path", None)]
        elif isinstance(origin, type) and issubclass(origin, os.PathLike):
            out += paths(tmp) if tmp is not None else [("a path", None)]
        elif _is_mapping(arm):
            out += mappings()
        elif _is_sequence(arm):
            out += sequences(arm)
    seen: set[str] = set()
    return [(label, v) for label, v in out if not (label in seen or seen.add(label))]


def fuzzable(hint: Any) -> bool:
    """Whether :func:`adversarial` derives any value for ``hint`` (a parameter typed only as a
    class, a callable or a ``Literal`` gets none: its wrong values are the type test's)."""
    return bool(adversarial("x", hint, None))


# -- one entry point's calls, in a forked child ---------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A call the oracle refuses: what was called, what happened, and the end of the trace."""

    entry: str
    param: str
    label: str
    verdict: str  # "traceback", "hang", "crash", "misleading"
    detail: str

    def key(self) -> str:
        """``entry(param=<label>)``: the call, as ``fuzz_known.KNOWN`` lists it."""
        return f"{self.entry}({self.param}=<{self.label}>)"

    def line(self) -> str:
        return f"{self.entry}({self.param}=<{self.label}>): {self.verdict}: {self.detail}"


def _scalars(value: Any, limit: int = 8) -> list[Any]:
    """The first numbers and strings inside a (nested) sequence value."""
    out: list[Any] = []
    stack = [value]
    while stack and len(out) < limit:
        item = stack.pop(0)
        if isinstance(item, (list, tuple)):
            stack[:0] = list(item)
        elif isinstance(item, (int, float, str)) and not isinstance(item, bool):
            out.append(item)
    return out


def names(message: str, param: str, value: Any) -> bool:
    """Whether a refusal says which argument it refuses: the parameter's name (``num_prompts``,
    ``num-prompts``, ``num prompts``) or the value itself as the message shows values (an
    empty string as ``''`` or "empty", a sequence by its ``repr`` or a number inside it)."""
    spelled = {param, param.replace("_", "-"), param.replace("_", " ")}
    if any(name in message for name in spelled):
        return True
    if isinstance(value, (str, os.PathLike)):
        text = str(value)
        if not text.strip():
            collapsed = re.sub(" +", " ", message)  # a message may fold runs of spaces
            shown = {repr(text), re.sub(" +", " ", repr(text))}
            return "''" in message or "empty" in message or any(s in collapsed for s in shown)
        return repr(text)[1:-1][:40] in message or text[:40] in message
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value) in message or repr(value) in message
    if isinstance(value, (list, tuple)):
        return repr(value)[:40] in message or any(
            str(x) in message or repr(x) in message for x in _scalars(value)
        )
    return False


def judge(param: str, value: Any, outcome: tuple[Any, ...]) -> tuple[str, str] | None:
    """``(verdict, detail)`` for a call's outcome, ``None`` when the oracle accepts it."""
    if outcome[0] == "returned":
        return None
    if outcome[0] == "hang":
        return "hang", f"no answer in {CALL_SECONDS} s"
    _, qualname, message, trace, ours = outcome
    if not ours:
        last = [ln for ln in trace.strip().splitlines() if ln.strip()][-3:]
        return "traceback", f"{qualname}: {message[:200]} | " + " | ".join(last)
    if "\n" in message.strip():
        return "misleading", f"a refusal of {len(message.splitlines())} lines: {message[:200]}"
    if not names(message, param, value):
        return "misleading", f"the refusal names neither {param!r} nor the value: {message[:240]}"
    return None


class _Hang(BaseException):
    """Raised in the child when a call runs past its time."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def _one_thread() -> None:
    """torch on one thread in the child: OpenMP's pool does not survive ``fork``, and a parallel
    region in a child forked from a process that had used it waits forever (canary_band's 20,000
    resamples did, after the CI process's earlier tests); one thread runs ATen's loops inline."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


class NetworkCall(BaseException):
    """Raised in the child when a call opens a network connection (none may: the plugin runs
    offline, and an entry point that reaches for the Hub must refuse first)."""


def _no_network() -> None:
    import socket

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NetworkCall(f"a network connection was opened ({args[1:2]})")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    signal.setitimer(signal.ITIMER_REAL, CALL_SECONDS)
    try:
        value = call()
        small = isinstance(value, tuple) and all(isinstance(v, (int, str)) for v in value)
        return ("returned", value if small else None)
    except _Hang:
        return ("hang",)
    except NetworkCall as exc:
        return ("raised", "network", str(exc), "", False)
    except BaseException as exc:  # judged by the parent
        return (
            "raised",
            f"{type(exc).__module__}.{type(exc).__qualname__}",
            str(exc),
            traceback.format_exc(limit=-6),
            isinstance(exc, PrecisionPluginError),
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _write(out: int, item: Any) -> None:
    data = pickle.dumps(item)
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        view = view[os.write(out, view) :]


def run_each_isolated(
    calls: Sequence[tuple[str, str, Callable[[], Any]]], budget: float
) -> Iterator[tuple[str, str, tuple[Any, ...]]]:
    """Every call, in forked children: one child runs the calls in order (``enable()`` torn
    down after each) until one crashes or hangs, then a fresh child goes on from the next one
    (a call that hangs is run once more in a child of its own, and is a hang only if it hangs
    there too: a child forked from a busy process on a loaded machine can stall);
    yields ``(param, label, outcome)``. ``budget``: seconds a child may go without an answer."""
    left = list(calls)
    while left:
        done = 0
        for param, label, outcome in run_isolated(left, budget):
            if outcome[0] == "hang":  # once more, alone: a loaded machine is not a hang
                call = next(c for c in left if c[:2] == (param, label))
                outcome = next(run_isolated([call], budget))[2]
            done += 1
            yield param, label, outcome
        left = left[max(done, 1) :]


def run_isolated(
    calls: Sequence[tuple[str, str, Callable[[], Any]]], budget: float
) -> Iterator[tuple[str, str, tuple[Any, ...]]]:
    """Run ``(param, label, call)`` in one forked child, in order; yield each outcome, or a
    ``crash`` for the call that was running when the child died (the rest are not run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        try:
            _one_thread()
            cap_memory()
            _no_network()
            signal.signal(signal.SIGALRM, _on_alarm)
            sys.stdout = sys.stderr = io.StringIO()  # what a function prints is not a finding
            for param, label, call in calls:
                _write(write_end, ("start", param, label))
                _write(write_end, ("done", param, label, _outcome(call)))
                _teardown()
        finally:
            os._exit(0)
    os.close(write_end)
    buffer, running, deadline = b"", None, time.monotonic() + budget
    try:
        while True:
            left = deadline - time.monotonic()
            deadline = time.monotonic() + budget
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                if running is not None:
                    yield running[0], running[1], ("hang",)
                return
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            while len(buffer) >= 8 and len(buffer) >= 8 + int.from_bytes(buffer[:8], "little"):
                size = int.from_bytes(buffer[:8], "little")
                item, buffer = pickle.loads(buffer[8 : 8 + size]), buffer[8 + size :]
                if item[0] == "start":
                    running = item[1:]
                else:
                    running = None
                    yield item[1], item[2], item[3]
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if running is not None:
        yield running[0], running[1], ("raised", "crash", f"the child died (status {status})",
                                       "", False)  # fmt: skip


def _teardown() -> None:
    """``enable()`` undone after each call (a call that enabled must not change the next)."""
    try:
        import precision_plugin

        precision_plugin.disable()
    except Exception:
        pass
