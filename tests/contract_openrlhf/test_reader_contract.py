"""The OpenRLHF dialect of the strict config reader against OpenRLHF's own parser.

Each command line is parsed twice, by ``train_ppo_ray``'s real parser
(``precision_plugin.openrlhf.parse_args``) and by ``precision_plugin._core.configs.OPENRLHF``: the
keys the plugin reads get the same values, what the parser refuses the reader refuses, and no
flag of the real parser is taken for a typo of a key the reader knows.
"""

from __future__ import annotations

import argparse
from unittest import mock

import pytest
from conftest import base_argv

from precision_plugin._core.configs import OPENRLHF
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.openrlhf import parse_args
from precision_plugin.openrlhf.check import arg


def real_flags(argv: list[str]) -> set[str]:
    """Every option string of the parsers ``train_ppo_ray`` builds."""
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, *a: object, **k: object) -> object:
        parsers.append(self)
        return original(self, *a, **k)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab):
        parse_args(argv)
    return {o for p in parsers for action in p._actions for o in action.option_strings}


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--vllm.num_engines", "0"],
        ["--ds.param_dtype", "fp16", "--vllm.num_engines=2"],
        ["--ds.load_in_4bit", "--ds.tensor_parallel_size", "2"],
        ["--algo.advantage.is_correction_level", "token"],
    ],
)
def test_the_reader_reads_what_the_parser_reads(llama_dir, extra):
    argv = [*base_argv(llama_dir), *extra]
    parsed = parse_args(argv)
    read = OPENRLHF.read_argv(argv)
    for path, value in read.items():
        assert arg(parsed, path) == value, path


@pytest.mark.parametrize(
    "extra",
    [
        ["--vllm.num_engines", "two"],
        ["--vllm.num_engines", "2.5"],
        ["--algo.advantage.is_correction_level", "false"],
        ["--ds.param_dtype", "float16"],
        ["--ds.load_in_4bit=false"],
        ["--vllm.num_engines"],
    ],
)
def test_what_the_parser_refuses_the_reader_refuses(llama_dir, extra):
    argv = [*base_argv(llama_dir), *extra]
    with pytest.raises(PrecisionConfigError, match="parser refused"):
        parse_args(argv)
    with pytest.raises(PrecisionConfigError):
        OPENRLHF.read_argv(argv)


def test_no_real_flag_is_taken_for_a_typo(llama_dir):
    flags = real_flags(base_argv(llama_dir))
    assert set(OPENRLHF.by_flag) - {"--algo.advantage.is_correction_enable"} <= flags
    typos = {f: OPENRLHF.typo(f, list(OPENRLHF.by_flag)) for f in flags}
    assert {f: near for f, near in typos.items() if near} == {}
