"""The ``precision-plugin`` command line: ``probe``, ``sanity``, ``doctor``, ``verl-overrides``,
``openrlhf-args`` and ``gguf-checkpoint``, one module each (the probe's ``--attribute`` options
beside it, in ``probe_attribution``), named in one registry (``registry.COMMANDS``); argument
types in ``argtypes``, streams and signals in ``process``, and the one results path of the
measuring commands in ``output``.

Exit codes: 0 success; 1 the probe's float32 self-check failed (the measurement is invalid) or
``doctor`` found a blocking problem; 2 bad input (one line on stderr, no traceback); 74 the
output could not be written (stdout closed or full; every file asked for is written first);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM), temporary files removed either way.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.probe import engine_names
from precision_plugin.cli.process import (
    PROG,
    OutputLost,
    Terminated,
    say,
    sigterm_as_interrupt,
    silence_stdout,
)
from precision_plugin.cli.registry import COMMANDS, build_parser
from precision_plugin.errors import PrecisionPluginError

#: The command line's interface is its arguments (checked by argparse), not Python names;
#: ``main`` is the console script ``precision_plugin.cli:main``.
__all__: list[str] = []

EXIT_OK, EXIT_FAILED, EXIT_USAGE = ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE
#: The output could not be written (sysexits' EX_IOERR); SIGINT and SIGTERM as the shell counts.
EXIT_OUTPUT, EXIT_INTERRUPTED = ExitCode.OUTPUT, ExitCode.INTERRUPTED
EXIT_TERMINATED = ExitCode.TERMINATED


class _NotCpuAutodetect(logging.Filter):
    """Drops DeepSpeed's "Setting accelerator to CPU" warning (printed on importing it, which
    transformers does): the commands say themselves which device they run on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")


def _quiet_transformers() -> None:
    """Hide transformers' per-load progress bars (the probe shows its own) and DeepSpeed's
    accelerator guess."""
    deepspeed_log = logging.getLogger("DeepSpeed")  # the name DeepSpeed's logger is made with
    if not any(isinstance(f, _NotCpuAutodetect) for f in deepspeed_log.filters):
        deepspeed_log.addFilter(_NotCpuAutodetect())
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return
    hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``precision-plugin``; returns the exit code."""
    with sigterm_as_interrupt():
        code = _main(list(sys.argv[1:] if argv is None else argv))
    if code == EXIT_OUTPUT:
        silence_stdout()
    return code


def _main(argv: list[str]) -> int:
    try:
        # Asking plugins for engines can be slow (vLLM); only the probe needs them.
        parser = build_parser(engine_names() if "probe" in argv else ("hf",))
        args = parser.parse_args(argv)
        args.argv = argv  # the command line, for the provenance of results files
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(name)s: %(levelname)s: %(message)s",
        )
        command = COMMANDS.get(args.command, COMMANDS["doctor"])
        if command.loads_models:
            _quiet_transformers()
        return command.run(args)
    except PrecisionPluginError as exc:
        message = " ".join(str(exc).split())
        say(f"{PROG}: error: {message}\n")
        return EXIT_USAGE
    except OutputLost as exc:
        say(f"{PROG}: error: cannot write the output: {exc}.\n")
        return EXIT_OUTPUT
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except Terminated:
        say(f"{PROG}: terminated\n")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        say(f"{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
