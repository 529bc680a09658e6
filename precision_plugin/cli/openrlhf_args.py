"""``precision-plugin openrlhf-args``: the train_ppo_ray arguments and Ray runtime env that make
OpenRLHF follow the policy, or a check of the arguments a run passes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from precision_plugin.cli.argtypes import UsageError, single_dtype
from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.cli.process import writing_stdout


def add_parser(sub: Any, engines: Sequence[str] = ()) -> None:
    """The ``openrlhf-args`` subcommand."""
    orl = sub.add_parser(
        "openrlhf-args",
        help="the train_ppo_ray arguments and Ray runtime env that make OpenRLHF follow the policy",
        description=(
            "Print the arguments for `python -m openrlhf.cli.train_ppo_ray ... "
            "$(precision-plugin openrlhf-args)`, one per line; --runtime-env prints the Ray "
            "runtime env (PRECISION_PLUGIN for the vLLM engine actors) as JSON; --check parses "
            "the train_ppo_ray arguments after it with the installed OpenRLHF's parser and "
            "checks them (exit 1 on a contradiction)."
        ),
    )
    orl.add_argument(
        "--dtype",
        type=single_dtype,
        default=None,
        help="policy dtype (default: $PRECISION_PLUGIN, else float16)",
    )
    orl.add_argument(
        "--openrlhf-version",
        default=None,
        help="OpenRLHF version to target (default: the installed one)",
    )
    mode = orl.add_mutually_exclusive_group()
    mode.add_argument(
        "--runtime-env", action="store_true", help="print the Ray runtime env as JSON"
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="check the train_ppo_ray arguments that follow (after --)",
    )
    orl.add_argument("openrlhf_argv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Print the arguments or the runtime env, or check the arguments after ``--`` (exit 1 on a
    contradiction)."""
    from precision_plugin import openrlhf
    from precision_plugin._core import frameworks
    from precision_plugin._core.manager import resolve_policy

    policy = resolve_policy()
    if args.dtype:
        policy = policy.replace(dtype=args.dtype)
    argv = list(args.openrlhf_argv)
    argv = argv[1:] if argv[:1] == ["--"] else argv
    if argv and not args.check:
        raise UsageError(f"unexpected arguments {argv!r}; to check them pass --check -- ARGS")
    if args.runtime_env:
        if frameworks.openrlhf_param_dtype(policy) is None:
            raise UsageError(
                f"--runtime-env for a {policy.dtype} policy: OpenRLHF's learner runs bf16 or "
                f"fp16 only, so the vLLM engines would sample in {policy.dtype} against a "
                f"bf16/fp16 learner; pass --dtype float16 or bfloat16"
            )
        if args.openrlhf_version is not None:
            raise UsageError(
                f"--openrlhf-version {args.openrlhf_version!r}: the Ray runtime env is the same "
                f"for every OpenRLHF version, so --runtime-env does not use it; drop "
                f"--openrlhf-version (or --runtime-env, for that version's train_ppo_ray "
                f"arguments)"
            )
        text = json.dumps(openrlhf.runtime_env(policy))  # its errors are bad input, not output
        with writing_stdout():
            sys.stdout.write(text + "\n")
        return ExitCode.OK
    if not args.check:
        lines = openrlhf.args(policy, openrlhf_version=args.openrlhf_version)
        with writing_stdout():
            sys.stdout.write("\n".join(lines) + "\n")
        return ExitCode.OK
    parsed = openrlhf.parse_args(argv)
    findings = openrlhf.find_problems(parsed, policy, openrlhf_version=args.openrlhf_version)
    errors = sum(f.status == "error" for f in findings)
    with writing_stdout():
        for f in findings:
            sys.stdout.write(f"{f.status}: {f.message}\n" + (f"  fix: {f.fix}\n" if f.fix else ""))
        sys.stdout.write(f"{errors} contradiction(s) with the {policy.dtype} policy\n")
    return ExitCode.FAILED if errors else ExitCode.OK
