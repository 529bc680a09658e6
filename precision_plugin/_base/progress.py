"""Progress of long commands: a live bar in a terminal, plain lines anywhere else.

In a terminal the CLI shows a rich progress bar. When its output is a CI log, a pipe or a file
under ``nohup``, a bar would print nothing until the end, so progress becomes plain lines: one
when a phase starts, one each time a phase passes another tenth of its work, and a heartbeat
every ``interval`` seconds while nothing changes, so a quiet log always says where a run is.

Progress is best-effort, never the reason a command fails: a write that fails (stderr full,
closed, a pipe whose reader left) turns progress off for the rest of the command with one log
record, and a count that is no number (``NaN``, ``None``) shows as ``?``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from precision_plugin.errors import PrecisionConfigError

#: ``progress(description, completed, total)``: what long-running functions call.
ProgressFn = Callable[[str, int, int], None]

#: Seconds between heartbeat lines when nothing changed (plain lines only).
HEARTBEAT_SECONDS = 60.0

log = logging.getLogger("precision_plugin")


def _count(value: object) -> int | None:
    """A progress count as a whole number >= 0, or ``None`` when it is none (shown as ``?``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class PlainProgress:
    """Progress as plain lines on ``stream`` (see the module docstring)."""

    def __init__(
        self, stream: TextIO, *, prefix: str = "", interval: float = HEARTBEAT_SECONDS
    ) -> None:
        self._stream = stream
        self._prefix = prefix
        self._interval = interval
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._state: tuple[str, int | None, int | None] | None = None
        self._off = False
        self._tenth = -1
        self._last_line = self._started
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __call__(self, description: str, completed: int, total: int) -> None:
        """Record the current phase and its progress; print a line when it is news. Never
        raises: a count that is no number shows as ``?``, a failed write turns progress off."""
        if self._off:
            return
        with self._lock:
            done, whole = _count(completed), _count(total)
            phase_changed = self._state is None or self._state[0] != description
            tenth = int(10 * done / whole) if done is not None and whole else -1
            self._state = (str(description), done, whole)
            if phase_changed or tenth > self._tenth:
                self._tenth = tenth
                self._line("")

    def _line(self, suffix: str) -> None:
        assert self._state is not None
        description, completed, total = self._state
        now = time.monotonic()
        if total is None and completed is None:
            count = " ?/?"
        elif total == 0:
            count = ""
        else:
            count = f" {'?' if completed is None else completed}/{'?' if total is None else total}"
        text = f"{self._prefix}[{_clock(now - self._started)}] {description}{count}{suffix}\n"
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError) as exc:  # full, closed, broken pipe: progress goes quiet
            self._off = True
            log.info("progress output turned off: writing it failed (%s)", exc)
        self._last_line = now

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self._interval, 5.0)):
            with self._lock:
                quiet = time.monotonic() - self._last_line
                if self._state is not None and quiet >= self._interval and not self._off:
                    self._line(" (still running)")

    def __enter__(self) -> PlainProgress:
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._beat.join()


@contextlib.contextmanager
def progress_reporter(
    console: Any, *, prefix: str = "", interval: float = HEARTBEAT_SECONDS
) -> Iterator[ProgressFn]:
    """A progress function for the duration of the block: a transient rich bar when
    ``console`` (a ``rich.console.Console``) is a terminal, else plain lines on its file.
    ``console=None`` means plain lines on ``sys.stderr``; anything else without a rich
    console's ``is_terminal`` and ``file`` is a ``PrecisionConfigError`` naming what to pass."""
    if console is None:
        with PlainProgress(sys.stderr, prefix=prefix, interval=interval) as plain:
            yield plain
        return
    if not (hasattr(console, "is_terminal") and hasattr(console, "file")):
        raise PrecisionConfigError(
            f"progress_reporter(console): expected a rich.console.Console (or None for plain "
            f"lines on stderr), got {type(console).__name__}"
        )
    if not console.is_terminal:
        with PlainProgress(console.file, prefix=prefix, interval=interval) as plain:
            yield plain
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def update(description: str, completed: int, total: int) -> None:
            done, whole = _count(completed), _count(total)
            try:
                bar.update(task, description=str(description), completed=done or 0, total=whole)
            except (OSError, ValueError) as exc:  # the terminal went away: progress goes quiet
                log.info("progress bar update failed (%s)", exc)

        yield update
