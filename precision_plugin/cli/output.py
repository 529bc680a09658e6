"""The one output path of the measuring commands (``probe``, ``sanity``): output paths checked
before the run, the run with progress on stderr, then files first (``--json FILE`` with its
provenance, ``--plot``), the tables on stdout, and ``--json -`` last; a closed or full stdout is
exit 74 after every file asked for is written."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from precision_plugin._base.outputs import check_output_path
from precision_plugin._base.progress import ProgressFn
from precision_plugin._base.userfiles import check_path
from precision_plugin.cli.argtypes import UsageError
from precision_plugin.cli.process import PROG, OutputLost, stdout_usable, writing_stdout


def _check_not_in_model(args: argparse.Namespace, outputs: dict[str, str | None]) -> None:
    """Refuse a ``--model`` path the OS cannot take (a name over ``NAME_MAX`` bytes, a NUL
    byte), and an output path that is an existing file of the ``--model`` folder (its
    ``config.json``, weights or tokenizer): the results would replace part of the checkpoint."""
    model = getattr(args, "model", None)
    if isinstance(model, str):
        check_path(model, "--model")
    if not isinstance(model, str) or not Path(model).expanduser().is_dir():
        return
    folder = Path(model).expanduser().resolve()
    for option, path in outputs.items():
        if path is None or path == "-":
            continue
        target = Path(path).expanduser()
        if target.is_file() and folder in target.resolve().parents:
            raise UsageError(
                f"{option}: {path!r} is a file of the --model folder {model!r}; writing there "
                f"would replace part of the checkpoint; pass a path outside it"
            )


def _check_prompts_path(path: str) -> None:
    """Before the run, the ``--prompts`` file: a path the OS can take and, when something is
    there, a regular file within the data limit (a named pipe would block the reader,
    ``/dev/zero`` never ends); a missing file is left to the prompts reader's own message."""
    from precision_plugin._base import userfiles

    if os.path.lexists(check_path(path, "prompts:")):
        userfiles.regular_file(path, "prompts:", userfiles.MAX_DATA_BYTES)


def write(path: str, option: str, write_to: Callable[[Path], Any]) -> None:
    """Have ``write_to`` write ``path`` through the one checked writer
    ([`write_with`][precision_plugin._base.outputs.write_with]: a temporary file and a rename); an
    OS
    error (permissions, full disk) becomes one line, exit 2. The path was checked before the
    run (``check_outputs``)."""
    from precision_plugin._base.outputs import write_with

    write_with(path, option, write_to, check=False)


def check_outputs(args: argparse.Namespace) -> None:
    """Before a long run: ``--json``, ``--plot`` and (the probe's) ``--attribution-plot``
    writable, ``--model`` and ``--prompts`` paths the OS can take (``--prompts`` a regular
    file), and the results kept somewhere."""
    check_output_path(args.json, "--json")
    figures = {"--plot": args.plot, "--attribution-plot": getattr(args, "attribution_plot", None)}
    for option, path in figures.items():
        if path is not None:
            from precision_plugin.probe.plot import image_formats

            check_output_path(path, option, image_formats())
    if not stdout_usable() and (args.json is None or args.json == "-"):
        raise OutputLost(
            "stdout is closed and no --json FILE was given, so the results would be lost; "
            "pass --json FILE, or run with stdout open"
        )
    _check_not_in_model(args, {"--json": args.json, **figures})
    from precision_plugin._base.outputs import distinct_paths

    prompts = getattr(args, "prompts", None)
    if isinstance(prompts, str) and prompts.strip():
        _check_prompts_path(prompts)
    distinct_paths(
        {"--prompts": prompts} if prompts is not None else {},
        {"--json": args.json, **figures},
    )


def emit_json(args: argparse.Namespace, text: str, err: Any, *, to_file: bool) -> None:
    """Write a command's JSON results (``--json FILE`` when ``to_file``, else ``--json -``) with
    their provenance: the command line that produced them, the date, the versions and the
    machine."""
    if not args.json or (args.json == "-") == to_file:
        return
    from precision_plugin._base.provenance import cli_command, with_provenance

    data = with_provenance(json.loads(text), cli_command(args.argv))
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    if args.json == "-":
        with writing_stdout():
            sys.stdout.write(text)
        return
    from precision_plugin._base.outputs import write_atomic

    write_atomic(args.json, text, "--json")
    err.print(f"wrote {args.json}")


def console(stderr: bool = False) -> Any:
    """A rich console; 100 columns when writing to a file or pipe (rich would assume 80)."""
    from precision_plugin._base.outputs import console as plain_console

    out = plain_console(stderr=stderr)  # a broken pipe is an OSError: exit 74, one line
    return out if out.is_terminal else plain_console(stderr=stderr, width=100)


def with_progress(err: Any, work: Callable[[ProgressFn], Any]) -> Any:
    """Run ``work(progress)`` with a bar in a terminal, plain progress lines elsewhere."""
    from precision_plugin._base.progress import progress_reporter

    with progress_reporter(err, prefix=f"{PROG}: ") as progress:
        return work(progress)


def run_and_report(
    args: argparse.Namespace,
    work: Callable[[ProgressFn], Any],
    tables: Callable[[Any], Iterable[Any]],
    plot: Callable[[Any, Path], Any],
) -> tuple[Any, Any]:
    """Run ``work`` and hand its result (an object with ``to_json()``) out: ``--json FILE`` and
    ``--plot`` first (a closed or full stdout must not lose a whole run's results), then the
    ``tables`` on stdout (stderr with ``--json -``), then ``--json -``. Returns the result and
    the stderr console. Call ``check_outputs(args)`` before the run's own checks."""
    err = console(stderr=True)
    out = err if args.json == "-" else console()
    # Frameworks imported during the run may log to stdout (DeepSpeed does); keep stdout for
    # the tables and JSON.
    with contextlib.redirect_stdout(sys.stderr):
        result = with_progress(err, work)
    emit_json(args, result.to_json(), err, to_file=True)
    if args.plot:
        write(args.plot, "--plot", lambda path: plot(result, path))
        err.print(f"wrote {args.plot}")
    with writing_stdout():
        for table in tables(result):
            out.print(table)
    emit_json(args, result.to_json(), err, to_file=False)
    return result, err
