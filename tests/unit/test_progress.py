"""Progress of long commands: plain lines when the output is not a terminal."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from precision_plugin._base.progress import PlainProgress, progress_reporter


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


class _Failing(io.StringIO):
    """A stream whose writes fail as a full disk or a closed pipe does."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc
        self.tries = 0

    def write(self, text: str) -> int:
        self.tries += 1
        raise self.exc


def test_a_failing_stream_turns_progress_off_and_never_raises(caplog):
    import errno
    import logging

    for exc in (OSError(errno.ENOSPC, "No space left on device"), BrokenPipeError(), ValueError()):
        stream = _Failing(exc)
        with (
            caplog.at_level(logging.INFO, logger="precision_plugin"),
            PlainProgress(stream, interval=0.01) as progress,
        ):
            progress("rollout", 1, 4)
            progress("scoring", 2, 4)  # off: not tried again
            time.sleep(0.05)  # nor by the heartbeat
        assert stream.tries == 1
    assert caplog.text.count("progress output turned off") == 3


def test_counts_that_are_no_number_show_as_a_question_mark():
    stream = io.StringIO()
    with PlainProgress(stream, interval=3600) as progress:
        progress("a", float("nan"), 10)
        progress("b", 3, float("inf"))
        progress("c", None, None)  # type: ignore[arg-type]
        progress("d", -1, 4)
        progress("e", 2.0, 4)  # a float count is still a count
    assert _lines(stream) == ["[T] a ?/10", "[T] b 3/?", "[T] c ?/?", "[T] d ?/4", "[T] e 2/4"]


def test_progress_reporter_none_is_plain_lines_on_stderr_and_a_wrong_kind_is_named(capsys):
    import pytest

    from precision_plugin.errors import PrecisionConfigError

    with progress_reporter(None, prefix="p: ") as progress:
        progress("phase", 1, 2)
    assert _lines(io.StringIO(capsys.readouterr().err)) == ["p: [T] phase 1/2"]
    with (
        pytest.raises(PrecisionConfigError, match=r"expected a rich\.console\.Console"),
        progress_reporter("stderr"),
    ):
        pass


def test_the_live_bar_takes_a_count_that_is_no_number():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True)
    with progress_reporter(console) as progress:
        progress("phase", float("nan"), 2)
        progress("phase", 1, float("nan"))
