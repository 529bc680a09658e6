"""Progress of long commands: plain lines when the output is not a terminal."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from precision_plugin.progress import PlainProgress, progress_reporter


def _lines(stream: io.StringIO) -> list[str]:
    return [re.sub(r"\[\d+:\d\d:\d\d\]", "[T]", ln) for ln in stream.getvalue().splitlines()]


def test_plain_lines_for_each_phase_and_each_tenth_of_its_work():
    stream = io.StringIO()
    with PlainProgress(stream, prefix="prog: ", interval=3600) as progress:
        progress("loading", 0, 0)
        for done in range(0, 21):
            progress("rollout", done, 20)  # a line at 0, then at 2, 4, ... 20 (each tenth)
        progress("scoring", 1, 3)
    assert _lines(stream) == [
        "prog: [T] loading",
        *[f"prog: [T] rollout {d}/20" for d in range(0, 21, 2)],
        "prog: [T] scoring 1/3",
    ]


def test_a_heartbeat_while_a_phase_is_quiet():
    stream = io.StringIO()
    with PlainProgress(stream, interval=0.05) as progress:
        progress("rollout", 3, 8)
        time.sleep(0.4)
    lines = _lines(stream)
    assert lines[0] == "[T] rollout 3/8"
    assert len(lines) >= 3 and set(lines[1:]) == {"[T] rollout 3/8 (still running)"}


def test_no_heartbeat_before_the_first_phase_and_none_after_the_block():
    stream = io.StringIO()
    with PlainProgress(stream, interval=0.01):
        time.sleep(0.1)
    time.sleep(0.1)
    assert stream.getvalue() == ""


def test_a_console_that_is_not_a_terminal_gets_plain_lines():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False)
    with progress_reporter(console, prefix="p: ") as progress:
        progress("phase", 1, 2)
    assert _lines(stream) == ["p: [T] phase 1/2"]


def test_a_terminal_gets_the_live_bar_and_no_plain_lines():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True)
    with progress_reporter(console, prefix="p: ") as progress:
        progress("phase", 1, 2)
    assert "p: [" not in stream.getvalue()
