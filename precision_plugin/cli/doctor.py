"""``precision-plugin doctor``: what is installed, what is at risk, what ``enable()`` would
change."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from precision_plugin.cli.argtypes import single_dtype
from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.output import console
from precision_plugin.cli.process import writing_stdout


def add_parser(sub: Any, engines: Sequence[str] = ()) -> None:
    """The ``doctor`` subcommand."""
    doctor = sub.add_parser(
        "doctor",
        help="what is installed, what is at risk, what enable() would change",
        description=(
            "Report framework versions, the accelerator and every adapter's findings for a "
            "policy. Exits 1 when a finding is an error."
        ),
    )
    doctor.add_argument("--json", action="store_true", help="print JSON instead of tables")
    doctor.add_argument(
        "--dtype",
        type=single_dtype,
        default=None,
        help="policy dtype to check (default: $PRECISION_PLUGIN, else float16)",
    )
    doctor.add_argument(
        "--frameworks",
        metavar="NAMES",
        default=None,
        help="the frameworks your run uses, comma-separated (e.g. trl,vllm): only their "
        "problems block (default: every installed framework)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when a finding is an error."""
    from precision_plugin.doctor import doctor_policy, render_report, run_doctor

    frameworks = args.frameworks.split(",") if args.frameworks is not None else None
    report = run_doctor(doctor_policy(args.dtype), frameworks)
    with writing_stdout():
        if args.json:
            sys.stdout.write(report.to_json() + "\n")
        else:
            render_report(report, console())
    return ExitCode.FAILED if report.errors else ExitCode.OK
