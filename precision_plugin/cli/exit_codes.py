"""The exit codes of ``precision-plugin``, one enum (as pytest's ``ExitCode``); the values are
the command line's contract and never change."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a ``precision-plugin`` run ended with."""

    #: Success.
    OK = 0
    #: The probe's float32 self-check failed (the measurement is invalid), or ``doctor`` found a
    #: blocking problem.
    FAILED = 1
    #: Bad input: one line on stderr, no traceback.
    USAGE = 2
    #: The output could not be written (sysexits' EX_IOERR).
    OUTPUT = 74
    #: Interrupted (Ctrl-C), as the shell counts SIGINT.
    INTERRUPTED = 130
    #: Terminated (SIGTERM), as the shell counts it.
    TERMINATED = 143
