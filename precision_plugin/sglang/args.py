"""SGLang launch arguments: what a launch should get under a policy, and reading what one got.

Pure: SGLang is never imported. [`server_args`][precision_plugin.sglang.server_args] spells the
policy the way ``sglang serve`` / ``python -m sglang.launch_server`` (flags) and
``sglang.Engine(...)`` / ``ServerArgs(...)`` (keyword arguments) take it;
[`read_server_args`][precision_plugin.sglang.args.read_server_args] reads the precision-relevant
fields back from any of the forms a launch comes in (a ``ServerArgs`` record, keyword arguments,
a command line, an ``argparse.Namespace``), with SGLang's defaults for what is not given.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import Invalid, Validator, checked
from precision_plugin._core.frameworks import sglang_dtype
from precision_plugin._core.manager import resolve_policy
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import ENV_VAR, PrecisionPolicy

#: The ``ServerArgs`` fields the checks read, with SGLang 0.5.23's defaults
#: (``sglang/srt/arg_groups/fields/*.py``).
FIELDS: dict[str, Any] = {
    "model_path": None,
    "revision": None,
    "dtype": "auto",
    "kv_cache_dtype": "auto",
    "rl_on_policy_target": None,
    "enable_deterministic_inference": False,
    "enable_fp32_lm_head": False,
    "attention_backend": None,
    "prefill_attention_backend": None,
    "decode_attention_backend": None,
    "moe_runner_backend": "auto",
    "speculative_algorithm": None,
    "speculative_eagle_topk": None,
}
#: Boolean fields: ``store_true`` flags on SGLang's command line.
_SWITCHES = ("enable_deterministic_inference", "enable_fp32_lm_head")
#: Command-line spellings beyond ``--<field-with-dashes>`` (SGLang's ``--model`` alias).
_ALIASES = {"model_path": ("--model",)}


@checked
@dataclass(frozen=True)
class LaunchSettings:
    """What an SGLang launch gets under a policy.

    ``flags`` go on the ``sglang serve`` / ``python -m sglang.launch_server`` command line,
    ``kwargs`` into ``sglang.Engine(**kwargs)`` or ``ServerArgs(**kwargs)``, ``env`` into the
    environment of the server's processes (it activates the plugin's ``sglang.srt.plugins``
    entry point there).
    """

    flags: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def env_value(policy: PrecisionPolicy) -> str:
    """The ``PRECISION_PLUGIN`` value for ``policy``: the dtype name when nothing else differs
    from the defaults, else the policy's compact JSON."""
    if policy == PrecisionPolicy(dtype=policy.dtype):  # type: ignore[arg-type]
        return policy.dtype
    return policy.to_json()


@checked
def server_args(policy: PrecisionPolicy | Mapping[str, Any] | str | None = None) -> LaunchSettings:
    """The flags, keyword arguments and environment that make an SGLang launch run ``policy``.

    The dtype is spelled SGLang's way (``float16``, ``bfloat16``, ``float32``; SGLang's parser
    refuses ``fp16``) and the KV cache is left at ``auto`` (the model dtype: SGLang has no
    ``float16`` KV choice). ``policy`` goes through
    [`resolve_policy`][precision_plugin._core.manager.resolve_policy] (argument, active ``enable()``
    policy, ``PRECISION_PLUGIN``, defaults).
    """
    pol = resolve_policy(policy, what="precision_plugin.sglang.server_args()")
    dtype = sglang_dtype(pol)
    return LaunchSettings(
        flags=("--dtype", dtype, "--kv-cache-dtype", "auto"),
        kwargs={"dtype": dtype, "kv_cache_dtype": "auto"},
        env={ENV_VAR: env_value(pol)},
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises instead of printing usage and exiting the process: a
    malformed command line given to a check is the caller's error, not the end of the caller."""

    def error(self, message: str) -> NoReturn:
        raise PrecisionConfigError(
            f"the command line cannot be read as the framework would read it: {message} (e.g. "
            f"a flag at the end without its value); pass the arguments exactly as launched."
        )


def field_parser(
    prefix: str = "", skip: tuple[str, ...] = (), **flags: dict[str, Any]
) -> argparse.ArgumentParser:
    """A parser for the fields in :data:`FIELDS` as ``--{prefix}{field-with-dashes}`` (SGLang's
    spellings when ``prefix`` is empty, slime's with ``sglang-``), leaving out ``skip``; absent
    flags stay absent. ``flags`` adds more: ``{"--fp16": {"action": "store_true"}}``. A command
    line it cannot read raises ``PrecisionConfigError`` (argparse would exit the process)."""
    parser = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    for name in FIELDS:
        if name in skip:
            continue
        names = (_flag(f"{prefix}{name}"), *(() if prefix else _ALIASES.get(name, ())))
        if name in _SWITCHES:
            parser.add_argument(*names, dest=name, action="store_true")
        elif name == "speculative_eagle_topk":
            parser.add_argument(*names, dest=name, type=int)
        else:
            parser.add_argument(*names, dest=name)
    for flag, options in flags.items():
        parser.add_argument(flag, **options)
    return parser


def read_yaml(path: str, flag: str) -> Any:
    """The parsed YAML file ``flag`` names, read as PyYAML's ``safe_load`` does through the one
    reader (:mod:`precision_plugin._base.userfiles`: a regular file within the size limit, UTF-8,
    aliases within the node budget, depth, cycles and keys checked); every failure a
    ``PrecisionConfigError`` naming the flag and the file."""
    from precision_plugin._base import userfiles

    return userfiles.read_yaml(path, flag)


def _config_args(path: str) -> list[str]:
    """An SGLang ``--config`` YAML file as the command-line arguments SGLang turns it into
    (``ConfigArgumentMerger``: each key becomes ``--key`` as written, a true boolean a bare
    switch, a false one nothing, a list its items)."""
    data = read_yaml(path, "--config")
    if not isinstance(data, Mapping):
        raise PrecisionConfigError(
            f"--config {path!r} holds a YAML {type(data).__name__}, not the mapping of server "
            f"arguments SGLang reads."
        )
    args: list[str] = []
    for key, value in data.items():
        if value is True:
            args.append(f"--{key}")
        elif isinstance(value, list):
            args.extend([f"--{key}", *(str(v) for v in value)] if value else [])
        elif value is not False:
            args.extend([f"--{key}", str(value)])
    return args


def _from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """What SGLang's parser makes of ``argv`` for :data:`FIELDS`: command line over ``--config``
    over defaults (``prepare_server_args`` puts the file's arguments first)."""
    from precision_plugin._core.configs import SGLANG

    argv = list(argv)
    configs = [i for i, a in enumerate(argv) if a == "--config"]
    if len(configs) > 1:
        raise PrecisionConfigError(
            "SGLang: --config in the command line is given more than once, which SGLang "
            "refuses ('Multiple config files specified! Only one allowed.', "
            "server_args_config_parser.py); merge them into one YAML file."
        )
    if configs and configs[0] == len(argv) - 1:
        raise PrecisionConfigError(
            "SGLang: --config in the command line has no value: it is the last argument, which "
            "SGLang refuses ('No config file specified after --config flag!', "
            "server_args_config_parser.py); write --config FILE.yaml."
        )
    if configs:
        at = configs[0]
        argv = [*_config_args(argv[at + 1]), *argv[:at], *argv[at + 2 :]]
    given = vars(field_parser().parse_known_args(argv)[0])
    SGLANG.read_argv(argv)  # typos of known flags, a switch given a value
    return {**FIELDS, **given}


def _launch_args(args: Any) -> Any:
    """The boundary check of an SGLang launch: ``ServerArgs``, a dict or a command line."""
    if isinstance(args, (Mapping, list, tuple)) and len(args) == 0:
        raise Invalid(
            "is empty, so there is nothing to check (every launch names at least its model); "
            "pass ServerArgs, sglang.Engine's keyword arguments or the launch's command line"
        )
    if isinstance(args, Mapping):
        return args
    if isinstance(args, (list, tuple)) and all(isinstance(a, str) for a in args):
        return args
    if isinstance(args, (str, bytes, os.PathLike)) or not hasattr(args, "dtype"):
        raise Invalid(
            "is not SGLang's ServerArgs, the keyword arguments of sglang.Engine (a dict) or a "
            "command line (a list of strings); pass one of those"
        )
    return args


#: SGLang's ``ServerArgs``, the keyword arguments of ``sglang.Engine`` or a command line.
LAUNCH_ARGS = Validator("an SGLang launch: ServerArgs, a dict or a command line", _launch_args)


@checked(args=LAUNCH_ARGS)
def read_server_args(args: Any) -> dict[str, Any]:
    """The fields of :data:`FIELDS` of an SGLang launch, SGLang's defaults filling the gaps.

    ``args`` is a ``ServerArgs`` record (or anything with its attributes, e.g. an
    ``argparse.Namespace``), the keyword arguments of ``Engine``/``ServerArgs`` (a mapping; a
    key with dashes is read as its field), or a command line (a list of strings, ``--config
    FILE`` included).
    """
    if isinstance(args, Mapping):
        from precision_plugin._core.configs import SGLANG

        # a cycle or endless nesting is refused naming the argument, before it is flattened
        userfiles.check_argument(args, "SGLang: the keyword arguments (args)")
        kwargs = SGLANG.with_style("python")
        given = {str(key).replace("-", "_"): value for key, value in args.items()}
        if "version" not in given:  # keyword arguments, not a server's /server_info answer
            kwargs.read_mapping(given, "the keyword arguments")
        values = dict(FIELDS)
        for name, value in given.items():
            if name in FIELDS:
                values[name] = kwargs.value(name, value, "the keyword arguments")
        return values
    if isinstance(args, (list, tuple)) and all(isinstance(a, str) for a in args):
        return _from_argv(args)
    return {name: getattr(args, name, default) for name, default in FIELDS.items()}
