"""Process plumbing of the command line: the program name, stdout and stderr that may be closed
or full (exit 74, never a traceback), and SIGTERM unwinding like Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

from precision_plugin.errors import PrecisionPluginError

PROG = "precision-plugin"


class OutputLost(Exception):
    """stdout is closed, full, or a pipe whose reader has gone."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` (temporary folders) runs."""


def stdout_usable() -> bool:
    """Whether stdout exists and is open."""
    return sys.stdout is not None and not getattr(sys.stdout, "closed", False)


@contextlib.contextmanager
def writing_stdout() -> Any:
    """Turn a failed write to stdout into ``OutputLost`` (one line, exit 74), not a traceback."""
    if not stdout_usable():
        raise OutputLost("stdout is closed")
    try:
        yield
        sys.stdout.flush()
    except PrecisionPluginError:  # bad input found while printing (a ValueError): exit 2
        raise
    except (OSError, ValueError) as exc:  # ENOSPC, EPIPE; ValueError: closed underneath
        raise OutputLost(getattr(exc, "strerror", None) or str(exc)) from None


def say(text: str) -> None:
    """Write to stderr; a closed or full stderr loses the line, never raises."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(text)
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def silence_stdout() -> None:
    """After a failed write, point stdout at /dev/null: the interpreter's own flush at exit
    would otherwise print a traceback of the same failure."""
    if sys.stdout is None:
        return
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        sys.stdout = None  # type: ignore[assignment]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Any:
    """For the command's length, SIGTERM unwinds like Ctrl-C (temporary folders removed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
