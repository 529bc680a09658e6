"""The SGLang dialect of the strict config reader against SGLang's own parser (0.5.23).

The keys the plugin reads get the values SGLang's argparse gives them, what SGLang refuses the
reader refuses (a flag without its value, a switch given a value, ``--config`` last or twice),
and no flag of SGLang's parser is taken for a typo of a key the reader knows.
"""

from __future__ import annotations

import argparse

import pytest

from precision_plugin._core.configs import SGLANG
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.sglang import check_server_args


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "m", "--dtype", "float16"],
        ["--model-path", "m", "--speculative-eagle-topk", "4", "--enable-fp32-lm-head"],
        ["--model-path=m", "--kv-cache-dtype", "auto", "--enable-deterministic-inference"],
    ],
)
def test_the_reader_reads_what_sglang_reads(argv):
    parsed = vars(sglang_parser().parse_args(argv))
    for path, value in SGLANG.read_argv(argv).items():
        assert parsed[path] == value, path


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "m", "--speculative-eagle-topk", "x"],
        ["--model-path", "m", "--enable-fp32-lm-head=false"],
        ["--model-path", "m", "--dtype"],
    ],
)
def test_what_sglang_refuses_the_reader_refuses(argv):
    with pytest.raises(SystemExit):
        sglang_parser().parse_args(argv)
    with pytest.raises(PrecisionConfigError):
        SGLANG.read_argv(argv)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model-path", "m", "--config"], "No config file specified after --config flag!"),
        (["--config", "a.yaml", "--config", "b.yaml"], "Only one allowed"),
    ],
)
def test_config_last_or_twice_is_refused_by_both(argv, says):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(ValueError, match=says.replace("!", "")):
        prepare_server_args(argv)
    with pytest.raises(PrecisionConfigError, match=says.replace("!", "")):
        check_server_args(argv)


def test_no_real_flag_is_taken_for_a_typo():
    flags = {o for action in sglang_parser()._actions for o in action.option_strings}
    assert set(SGLANG.by_flag) <= flags
    typos = {f: SGLANG.typo(f, list(SGLANG.by_flag)) for f in flags}
    assert {f: near for f, near in typos.items() if near} == {}
