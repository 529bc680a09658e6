"""Bad inputs of issue 30 (meaning, not type): other programs' configs read by their own rules,
server answers, files and streams, deep structures, generation settings, progress.

Rows for the catalogue of ``tests/unit/test_bad_inputs.py`` (each a ``Case``'s keyword
arguments); ``rows(h)`` takes that module, for its helpers (``cli``, ``write``, ``STRICT``).
A row with ``raises=None`` holds the correct outcome, computed independently, in ``check``.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from precision_plugin import PrecisionConfigError, PrecisionMismatchError, PrecisionPolicy
from precision_plugin.errors import ServerAnswerError, ServerUnreachableError
from tests.loopback import free_port, serve

STRICT = PrecisionPolicy(strictness="error")
WARN = PrecisionPolicy()
DEEP = "[" * 5000 + "]" * 5000
DEEP_OBJECT = '{"a":' * 3000 + "1" + "}" * 3000


def call(module: str, name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    """``precision_plugin.<module>.<name>(*args, **kw)``."""

    def run(tmp: Path) -> Any:
        return getattr(importlib.import_module(f"precision_plugin.{module}"), name)(*args, **kw)

    return run


def dialect(program: str, how: str, data: Any, source: str = "cfg.yaml") -> Callable[[Path], Any]:
    """``DIALECTS[program].read_mapping(data, source)`` / ``read_argv(data)``."""

    def run(tmp: Path) -> Any:
        from precision_plugin._core.configs import DIALECTS

        d = DIALECTS[program]
        return d.read_argv(data) if how == "argv" else d.read_mapping(data, source)

    return run


def load(name: str, text: str | bytes, program: str = "verl") -> Callable[[Path], Any]:
    """``configs.load`` of a file ``name`` holding ``text``."""

    def run(tmp: Path) -> Any:
        from precision_plugin._core.configs import DIALECTS, load

        path = tmp / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return load(str(path), DIALECTS[program])

    return run


def override(text: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.configs import VERL, parse_override

        return parse_override(text, VERL)

    return run


def equals(expected: Any) -> Callable[[Any, Any], None]:
    def check(result: Any, caplog: Any) -> None:
        assert result == expected, result

    return check


def statuses(*expected: str, says: str = "") -> Callable[[Any, Any], None]:
    def check(result: Any, caplog: Any) -> None:
        assert [f.status for f in result] == list(expected), result
        assert says in " ".join(f.message for f in result), result

    return check


def has_finding(status: str, says: str) -> Callable[[Any, Any], None]:
    def check(result: Any, caplog: Any) -> None:
        assert any(f.status == status and says in f.message for f in result), result

    return check


def no_error_finding(result: Any, caplog: Any) -> None:
    assert not [f for f in result if f.status == "error"], result


# -- numbers ------------------------------------------------------------------------------------
def cons(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    return call("consequence", name, *args, **kw)


def mism(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    return call("mismatch", name, *args, **kw)


def growth(**changes: Any) -> Callable[[Path], Any]:
    """A ``GrowthFit`` built by hand with ``changes`` to a valid one."""

    def run(tmp: Path) -> Any:
        from precision_plugin._core.metrics.consequence import GrowthFit, Interval

        fields = {"sequences": 2, "tokens": 12, "drift": -0.01, "drift_stderr": 0.005,
                  "variance": 0.02, "variance_low": 0.01, "variance_high": 0.05,
                  "tis_clip": Interval(0.0, 0.0, 0.1)}  # fmt: skip
        return GrowthFit(**{**fields, **changes})

    return run


def no_sequence(result: Any, caplog: Any) -> None:
    assert result.sequences == 0 and math.isnan(result.variance), result


def project_length(length: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.metrics.consequence import fit_growth, project

        return project(fit_growth([0.1, 0.2], [4, 8]), length)

    return run


def raises_not(result: Any, caplog: Any) -> None:
    """The call returned (the check is the call not raising)."""


# -- OpenRLHF ----------------------------------------------------------------------------------
def orl(args: dict[str, Any], policy: Any = STRICT) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.openrlhf import find_problems

        return find_problems({"ds.param_dtype": "fp16", **args}, policy, environ={})

    return run


def orl_check(args: dict[str, Any]) -> Callable[[Path], Any]:
    return call("openrlhf", "check_args", {"ds.param_dtype": "fp16", **args}, STRICT)


# -- SGLang, slime, AReaL -----------------------------------------------------------------------
def sglang_argv(*argv: str | Callable[[Path], str], policy: Any = STRICT) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.sglang import check_server_args

        return check_server_args([a(tmp) if callable(a) else a for a in argv], policy)

    return run


def sglang_yaml(text: str) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        path = tmp / "server.yaml"
        path.write_text(text)
        return str(path)

    return make


def slime(*argv: str) -> Callable[[Path], Any]:
    return call("slime", "check_slime_args", list(argv), STRICT, environ={})


def areal(cfg: dict[str, Any], policy: Any = "float16") -> Callable[[Path], Any]:
    return call("areal", "check_areal_config", cfg, policy)


# -- verl ----------------------------------------------------------------------------------------
def verl_cfg(**rollout: Any) -> dict[str, Any]:
    return {
        "actor_rollout_ref": {
            "rollout": {"dtype": "float16", "calculate_log_probs": True, **rollout},
            "actor": {"strategy": "fsdp"},
        }
    }


# -- TRL -----------------------------------------------------------------------------------------
def sampling(**args: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.trl.rollout import sampling_settings

        settings = types.SimpleNamespace(**{"temperature": 1.0, "max_completion_length": 8, **args})
        return sampling_settings(types.SimpleNamespace(args=settings))

    return run


def max_tokens_is(expected: int) -> Callable[[Any, Any], None]:
    def check(result: Any, caplog: Any) -> None:
        assert result[1] == expected, result

    return check


# -- servers -------------------------------------------------------------------------------------
def server(engine: str, status: int, body: bytes = b"", policy: Any = STRICT, **kw: Any):
    def run(tmp: Path) -> Any:
        verify = importlib.import_module(f"precision_plugin.{engine}").verify_server
        with serve(status, body, **kw) as url:
            return verify(url, policy)

    return run


def nothing_listens(engine: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        verify = importlib.import_module(f"precision_plugin.{engine}").verify_server
        return verify(f"http://127.0.0.1:{free_port()}", STRICT)

    return run


def get(status: int, body: bytes = b"{}", **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.serving import get_json

        with serve(status, body, **kw) as url:
            return get_json(url, "/server_info", engine="vLLM", timeout=0.5)

    return run


# -- progress ------------------------------------------------------------------------------------
class _Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def plain(*calls: tuple[Any, Any, Any], stream: Any = None) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._base.progress import PlainProgress

        out = io.StringIO() if stream is None else stream
        with PlainProgress(out, interval=3600) as progress:
            for description, done, total in calls:
                progress(description, done, total)
        return [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]

    return run


def reporter(console: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._base.progress import progress_reporter

        with progress_reporter(console) as progress:
            progress("x", 1, 2)
        return True

    return run


# -- deep JSON -----------------------------------------------------------------------------------
def from_env(value: str) -> Callable[[Path], Any]:
    return lambda tmp: PrecisionPolicy.from_env({"PRECISION_PLUGIN": value})


def ds_config(text: str, as_file: bool = False) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.deepspeed import apply_config

        if as_file:
            path = tmp / "ds.json"
            path.write_text(text)
            return apply_config(str(path))
        return apply_config(text)

    return run


# -- docs renderer -------------------------------------------------------------------------------
def render(text: str, files: dict[str, str] | None = None) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        import importlib.util

        root = Path(__file__).resolve().parents[2]
        spec = importlib.util.spec_from_file_location(
            "render_docs_30", root / "scripts" / "render_docs.py"
        )
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        module.RESULTS = tmp
        (tmp / "demo.json").write_text(json.dumps({"ratio": 47.25, "rows": [{"n": 1}]}))
        for name, body in (files or {}).items():
            (tmp / name).write_text(body)
        try:
            return module.rendered(text, "page.md")
        except module.RenderError as exc:  # the script's own error class, as one message
            raise PrecisionConfigError(str(exc)) from None

    return run


def rows(h: Any) -> list[dict[str, Any]]:
    """The rows, built with the helpers of ``tests/unit/test_bad_inputs.py`` (``h``)."""
    cfg = "configs"
    out: list[dict[str, Any]] = []

    def bad(id: str, cls: str, run: Any, *names: str, raises: Any = PrecisionConfigError) -> None:
        out.append({"id": id, "cls": cls, "run": run, "raises": raises, "names": names})

    def good(id: str, cls: str, run: Any, check: Any) -> None:
        out.append({"id": id, "cls": cls, "run": run, "raises": None, "check": check})

    # -- the strict reader, one dialect at a time -------------------------------------------------
    bad(
        "reader openrlhf num_engines word",
        cfg,
        dialect("OpenRLHF", "map", {"vllm.num_engines": "two"}),
        "vllm.num_engines",
        "'two'",
        "int()",
    )
    bad(
        "reader openrlhf num_engines float",
        cfg,
        dialect("OpenRLHF", "map", {"vllm.num_engines": 2.5}),
        "(--vllm.num_engines)",
        "2.5",
        "integer",
    )
    bad(
        "reader openrlhf num_engines bool",
        cfg,
        dialect("OpenRLHF", "map", {"vllm.num_engines": True}),
        "True, a boolean",
    )
    good(
        "reader openrlhf num_engines '0' is 0",
        cfg,
        dialect("OpenRLHF", "map", {"vllm.num_engines": "0"}),
        equals({"vllm.num_engines": 0}),
    )
    good(
        "reader openrlhf nested '4'",
        cfg,
        dialect("OpenRLHF", "map", {"vllm": {"num_engines": "4"}}),
        equals({"vllm.num_engines": 4}),
    )
    bad(
        "reader openrlhf is level false",
        cfg,
        dialect("OpenRLHF", "map", {"algo.advantage.is_correction_level": "false"}),
        "is 'false'",
        "off, token, seq",
    )
    bad(
        "reader openrlhf is level Token",
        cfg,
        dialect("OpenRLHF", "map", {"algo.advantage.is_correction_level": "Token"}),
        "did you mean 'token'",
    )
    bad(
        "reader openrlhf is enable 'false'",
        cfg,
        dialect("OpenRLHF", "map", {"algo.advantage.is_correction_enable": "false"}),
        "switch (store_true)",
        "True or False",
    )
    bad(
        "reader openrlhf 4bit 'no'",
        cfg,
        dialect("OpenRLHF", "map", {"ds.load_in_4bit": "no"}),
        "ds.load_in_4bit",
        "switch",
    )
    bad(
        "reader openrlhf param_dtype float16",
        cfg,
        dialect("OpenRLHF", "map", {"ds.param_dtype": "float16"}),
        "'float16'",
        "bf16, fp16",
    )
    bad(
        "reader openrlhf typo num_engine",
        cfg,
        dialect("OpenRLHF", "map", {"vllm.num_engine": 2}),
        "vllm.num_engine",
        "did you mean 'vllm.num_engines'",
    )
    bad(
        "reader openrlhf typo param_dtpye",
        cfg,
        dialect("OpenRLHF", "map", {"ds": {"param_dtpye": "fp16"}}),
        "did you mean 'ds.param_dtype'",
    )
    bad(
        "reader openrlhf argv missing value",
        cfg,
        dialect("OpenRLHF", "argv", ["--vllm.num_engines"]),
        "--vllm.num_engines",
        "expected one argument",
    )
    bad(
        "reader openrlhf argv value then flag",
        cfg,
        dialect("OpenRLHF", "argv", ["--ds.param_dtype", "--vllm.num_engines", "2"]),
        "--ds.param_dtype",
        "has no value",
    )
    bad(
        "reader openrlhf argv switch=value",
        cfg,
        dialect("OpenRLHF", "argv", ["--ds.load_in_4bit=false"]),
        "takes no value",
    )
    bad(
        "reader openrlhf argv typo",
        cfg,
        dialect("OpenRLHF", "argv", ["--vllm.num_engnes", "2"]),
        "did you mean --vllm.num_engines",
    )
    good(
        "reader openrlhf argv =value",
        cfg,
        dialect("OpenRLHF", "argv", ["--vllm.num_engines=3", "--unrelated", "x"]),
        equals({"vllm.num_engines": 3}),
    )
    good(
        "reader openrlhf neighbour key is no typo",
        cfg,
        dialect("OpenRLHF", "map", {"algo.advantage.is_correction_mode": "clip"}),
        equals({}),
    )
    bad(
        "reader openrlhf argv a string",
        cfg,
        dialect("OpenRLHF", "argv", "--vllm.num_engines 2"),
        "expected a list of str",
        "shlex.split(command_line)",
    )
    bad(
        "reader sglang switch with value",
        cfg,
        dialect("SGLang", "argv", ["--enable-fp32-lm-head=true"]),
        "takes no value",
    )
    bad(
        "reader sglang typo flag",
        cfg,
        dialect("SGLang", "argv", ["--kv-cache-dtpye", "auto"]),
        "did you mean --kv-cache-dtype",
    )
    bad(
        "reader sglang topk word",
        cfg,
        dialect("SGLang", "argv", ["--speculative-eagle-topk", "four"]),
        "'four'",
        "int()",
    )
    bad(
        "reader slime fp16 bf16",
        cfg,
        dialect("slime", "argv", ["--fp16", "--bf16"]),
        "--fp16 and --bf16",
        "arguments.py:1196",
    )
    bad(
        "reader slime bf16 fp16",
        cfg,
        dialect("slime", "argv", ["--bf16", "--lr", "1e-6", "--fp16"]),
        "are given together",
    )
    bad(
        "reader megatron fp16 bf16",
        cfg,
        dialect("Megatron-LM", "argv", ["--bf16", "--fp16"]),
        "Megatron-LM refuses the pair",
    )
    good(
        "reader megatron fp16 alone",
        cfg,
        dialect("Megatron-LM", "argv", ["--fp16"]),
        equals({"fp16": True}),
    )
    bad(
        "reader slime sglang-dtype missing",
        cfg,
        dialect("slime", "argv", ["--sglang-dtype"]),
        "--sglang-dtype",
        "expected one argument",
    )
    bad(
        "reader verl quoted false",
        cfg,
        dialect("verl", "map", verl_cfg(calculate_log_probs="false"), "ppo.yaml"),
        "actor_rollout_ref.rollout.calculate_log_probs in ppo.yaml",
        "the string 'false'",
    )
    bad(
        "reader verl quoted yes",
        cfg,
        dialect("verl", "map", {"critic": {"enable": "yes"}}, "ppo.yaml"),
        "critic.enable in ppo.yaml",
        "'yes'",
    )
    bad(
        "reader verl typo dtpye",
        cfg,
        dialect("verl", "map", verl_cfg(dtpye="bf16"), "ppo.yaml"),
        "actor_rollout_ref.rollout.dtpye in ppo.yaml",
        "did you mean 'actor_rollout_ref.rollout.dtype'",
    )
    bad(
        "reader verl tp string",
        cfg,
        dialect("verl", "map", verl_cfg(tensor_model_parallel_size="2"), "ppo.yaml"),
        "tensor_model_parallel_size",
        "the string '2'",
    )
    bad(
        "reader verl lora_rank bool",
        cfg,
        dialect("verl", "map", {"actor_rollout_ref": {"model": {"lora_rank": True}}}),
        "lora_rank",
        "a boolean",
    )
    good(
        "reader verl mandatory ??? left",
        cfg,
        dialect("verl", "map", verl_cfg(calculate_log_probs="???")),
        equals(
            {
                "actor_rollout_ref.rollout.dtype": "float16",
                "actor_rollout_ref.rollout.calculate_log_probs": "???",
                "actor_rollout_ref.actor.strategy": "fsdp",
            }
        ),
    )
    good(
        "reader verl interpolation left",
        cfg,
        dialect("verl", "map", {"critic": {"enable": "${oc.env:X}"}}),
        equals({"critic.enable": "${oc.env:X}"}),
    )
    good(
        "reader verl override false",
        cfg,
        override("++actor_rollout_ref.rollout.calculate_log_probs=False"),
        equals(("actor_rollout_ref.rollout.calculate_log_probs", False)),
    )
    bad(
        "reader verl override no =",
        cfg,
        override("actor_rollout_ref.rollout.dtype"),
        "is not a Hydra override",
    )
    bad(
        "reader verl override typo",
        cfg,
        override("actor_rollout_ref.rollout.dtpye=float16"),
        "did you mean 'actor_rollout_ref.rollout.dtype'",
    )
    bad(
        "reader verl override tp word",
        cfg,
        override("actor_rollout_ref.rollout.tensor_model_parallel_size=two"),
        "the string 'two'",
    )
    good(
        "reader areal bool 'off'",
        cfg,
        dialect("AReaL", "map", {"sglang": {"enable_fp32_lm_head": "off"}}),
        equals({"sglang.enable_fp32_lm_head": False}),
    )
    good(
        "reader areal bool '1'",
        cfg,
        dialect("AReaL", "map", {"sglang": {"enable_fp32_lm_head": "1"}}),
        equals({"sglang.enable_fp32_lm_head": True}),
    )
    bad(
        "reader areal bool maybe",
        cfg,
        dialect("AReaL", "map", {"sglang": {"enable_fp32_lm_head": "maybe"}}, "areal.yaml"),
        "sglang.enable_fp32_lm_head in areal.yaml",
        "OmegaConf refuses",
    )
    bad(
        "reader areal typo",
        cfg,
        dialect("AReaL", "map", {"actor": {"dtpye": "half"}}),
        "did you mean 'actor.dtype'",
    )
    bad(
        "reader trl fp16 'false'",
        cfg,
        dialect("TRL", "map", {"fp16": "false"}, "GRPOConfig"),
        "fp16 in GRPOConfig",
        "non-empty string is true",
    )
    bad(
        "reader trl top_k float",
        cfg,
        dialect("TRL", "map", {"top_k": 5.0}, "GRPOConfig"),
        "top_k",
        "integer",
    )
    bad(
        "reader trl temperature text",
        cfg,
        dialect("TRL", "map", {"temperature": "0.7"}, "GRPOConfig"),
        "temperature",
        "where a number belongs",
    )
    bad(
        "reader trl vllm_mode typo",
        cfg,
        dialect("TRL", "map", {"vllm_mode": "colocated"}, "GRPOConfig"),
        "did you mean 'colocate'",
    )
    bad(
        "reader trl generation_kwargs list",
        cfg,
        dialect("TRL", "map", {"generation_kwargs": "[1]"}, "GRPOConfig"),
        "JSON list, not an object",
    )
    bad(
        "reader trl generation_kwargs NaN",
        cfg,
        dialect("TRL", "map", {"generation_kwargs": '{"top_p": NaN}'}, "GRPOConfig"),
        "NaN",
        "not JSON",
    )
    bad(
        "reader trl generation_kwargs deep",
        cfg,
        dialect("TRL", "map", {"generation_kwargs": DEEP_OBJECT}, "GRPOConfig"),
        "nested too deeply",
    )
    bad(
        "reader trl typo",
        cfg,
        dialect("TRL", "map", {"max_completion_lenght": 64}, "GRPOConfig"),
        "did you mean 'max_completion_length'",
    )

    rollout = "actor_rollout_ref:\n  rollout:\n"
    bad(
        "load verl typo in ppo.yaml",
        cfg,
        load("ppo.yaml", rollout + "    dtpye: float16\n"),
        "actor_rollout_ref.rollout.dtpye in ppo.yaml",
        "did you mean 'actor_rollout_ref.rollout.dtype'",
    )
    bad(
        "load verl quoted false",
        cfg,
        load("ppo.yaml", rollout + "    calculate_log_probs: 'false'\n"),
        "calculate_log_probs in ppo.yaml",
        "the string 'false'",
    )
    good(
        "load verl yes is true",
        cfg,
        load("ppo.yaml", rollout + "    calculate_log_probs: yes\n"),
        equals({"actor_rollout_ref": {"rollout": {"calculate_log_probs": True}}}),
    )
    bad(
        "load verl duplicate key",
        cfg,
        load("ppo.yaml", rollout + "    dtype: float16\n    dtype: bfloat16\n"),
        "'",
        "ppo.yaml",
        "duplicate key dtype",
    )
    bad(
        "load verl tp quoted",
        cfg,
        load("ppo.yaml", rollout + "    tensor_model_parallel_size: '2'\n"),
        "tensor_model_parallel_size in ppo.yaml",
        "the string '2'",
    )
    bad(
        "load missing file",
        cfg,
        lambda t: __import__("precision_plugin._core.configs", fromlist=["x"]).load(
            str(t / "no.yaml"), __import__("precision_plugin._core.configs", fromlist=["x"]).VERL
        ),
        "no.yaml",
        "does not exist",
    )
    bad("load a list", cfg, load("ppo.yaml", "- 1\n- 2\n"), "ppo.yaml", "holds a list")
    bad("load not UTF-8", cfg, load("ppo.yaml", b"a: \xff\n"), "ppo.yaml", "not UTF-8")
    bad(
        "load deep YAML",
        cfg,
        load("ppo.yaml", "a: " + "[" * 3000 + "]" * 3000 + "\n"),
        "ppo.yaml",
        "nests deeper than 64 levels",
    )
    bad("load broken YAML", cfg, load("ppo.yaml", "a: [1, 2\n"), "ppo.yaml", "not valid YAML")
    bad("load broken JSON", cfg, load("cfg.json", '{"a": }'), "cfg.json", "not valid JSON")
    bad(
        "load areal switch maybe",
        cfg,
        load("areal.yaml", "sglang:\n  enable_fp32_lm_head: maybe\n", "AReaL"),
        "sglang.enable_fp32_lm_head in areal.yaml",
        "OmegaConf refuses",
    )
    good(
        "load areal off is false",
        cfg,
        load("areal.yaml", "sglang:\n  enable_fp32_lm_head: off\n", "AReaL"),
        equals({"sglang": {"enable_fp32_lm_head": False}}),
    )
    bad(
        "load sglang config typo",
        cfg,
        load("server.yaml", "kv-cache-dtpye: auto\n", "SGLang"),
        "did you mean",
        "server.yaml",
    )

    # -- the adapters, through the reader ---------------------------------------------------------
    good(
        "openrlhf num_engines '0' is no engine",
        cfg,
        orl({"vllm.num_engines": "0"}),
        has_finding("info", "no vLLM engines"),
    )
    good(
        "openrlhf num_engines 0 is no engine",
        cfg,
        orl({"vllm.num_engines": 0}),
        has_finding("info", "no vLLM engines"),
    )
    good(
        "openrlhf num_engines '2' is engines",
        cfg,
        orl({"vllm.num_engines": "2"}),
        has_finding("error", "vLLM engines sample in bfloat16"),
    )
    bad(
        "openrlhf num_engines 'zero'",
        cfg,
        orl_check({"vllm.num_engines": "zero"}),
        "vllm.num_engines",
        "'zero'",
    )
    bad(
        "openrlhf is level 'false'",
        cfg,
        orl_check({"algo.advantage.is_correction_level": "false"}),
        "is_correction_level",
        "off, token, seq",
    )
    good(
        "openrlhf is level off is off",
        cfg,
        orl({"algo.advantage.is_correction_level": "off"}, WARN),
        has_finding("warning", "importance-sampling correction is off"),
    )
    good(
        "openrlhf is level token is on",
        cfg,
        orl({"algo.advantage.is_correction_level": "token"}, WARN),
        has_finding("ok", "importance-sampling correction is on"),
    )
    bad(
        "openrlhf 4bit 'false'",
        cfg,
        orl_check({"ds.load_in_4bit": "false"}),
        "ds.load_in_4bit",
        "switch",
    )
    bad(
        "openrlhf param_dtype float16",
        cfg,
        orl_check({"ds.param_dtype": "float16"}),
        "'float16'",
        "bf16, fp16",
    )
    bad(
        "openrlhf typo key",
        cfg,
        orl_check({"vllm.num_engnes": 2}),
        "did you mean 'vllm.num_engines'",
    )
    bad(
        "sglang --config last",
        cfg,
        sglang_argv("--dtype", "float16", "--config"),
        "--config",
        "No config file specified after --config flag!",
    )
    bad(
        "sglang --config twice",
        cfg,
        sglang_argv("--config", "a.yaml", "--config", "b.yaml"),
        "more than once",
        "Only one allowed",
    )
    bad(
        "sglang typo flag",
        cfg,
        sglang_argv("--dtpye", "float16", "--model-path", "m"),
        "did you mean --dtype",
    )
    bad(
        "sglang switch=value",
        cfg,
        sglang_argv("--dtype", "float16", "--enable-fp32-lm-head=false"),
        "--enable-fp32-lm-head",
        "ignored explicit argument 'false'",
    )
    bad(
        "sglang config deep",
        cfg,
        sglang_argv("--config", sglang_yaml("a:\n" + "  " * 1 + "[" * 3000 + "]" * 3000)),
        "--config",
        "nests deeper than 64 levels",
    )
    bad(
        "sglang config is a list",
        cfg,
        sglang_argv("--config", sglang_yaml("- 1\n- 2\n")),
        "holds a YAML list",
    )
    bad(
        "sglang kwargs switch 'false'",
        cfg,
        call(
            "sglang",
            "check_server_args",
            {"dtype": "float16", "enable_fp32_lm_head": "false"},
            STRICT,
        ),
        "enable_fp32_lm_head",
        "non-empty string is true",
    )
    bad(
        "sglang kwargs typo",
        cfg,
        call("sglang", "check_server_args", {"dtype": "float16", "kv_cache_dtpye": "auto"}, STRICT),
        "did you mean 'kv_cache_dtype'",
    )
    bad(
        "sglang kwargs topk '4'",
        cfg,
        call(
            "sglang",
            "check_server_args",
            {"dtype": "float16", "speculative_algorithm": "EAGLE", "speculative_eagle_topk": "4"},
            STRICT,
        ),
        "the string '4'",
    )
    bad(
        "sglang checkpoint BF16",
        cfg,
        call("sglang", "auto_dtype", {"torch_dtype": "BF16", "model_type": "llama"}),
        "'BF16'",
        "no torch dtype name",
    )
    bad(
        "sglang checkpoint Float16",
        cfg,
        call("sglang", "auto_dtype", {"torch_dtype": "Float16"}),
        "'Float16'",
        "case-sensitive",
    )
    bad(
        "sglang checkpoint fp16",
        cfg,
        call("sglang", "auto_dtype", {"dtype": "fp16"}),
        "'fp16'",
        "getattr(torch",
    )
    good(
        "sglang checkpoint half",
        cfg,
        call("sglang", "auto_dtype", {"torch_dtype": "half"}),
        equals("float16"),
    )
    good(
        "sglang checkpoint torch.bfloat16",
        cfg,
        call("sglang", "auto_dtype", {"torch_dtype": "torch.bfloat16"}),
        equals("bfloat16"),
    )
    bad(
        "slime fp16 bf16",
        cfg,
        slime("--fp16", "--bf16"),
        "--fp16 and --bf16",
        "Megatron-LM refuses the pair",
    )
    bad(
        "slime bf16 fp16 apart",
        cfg,
        slime("--bf16", "--hf-checkpoint", "m", "--fp16"),
        "given together",
    )
    bad("slime typo fp16", cfg, slime("--fp61"), "did you mean --fp16")
    bad(
        "slime sglang-dtype typo",
        cfg,
        slime("--sglang-dtpye", "float16"),
        "did you mean --sglang-dtype",
    )
    good(
        "areal half is float16",
        cfg,
        areal({"actor": {"dtype": "half", "backend": "megatron:d1"}}),
        statuses(),
    )
    good(
        "areal float16 torch name",
        cfg,
        areal({"actor": {"dtype": "torch.float16", "backend": "megatron:d1"}}),
        statuses(),
    )
    good(
        "areal bfloat16 matches",
        cfg,
        areal({"actor": {"dtype": "bfloat16"}}, "bfloat16"),
        statuses(),
    )
    bad(
        "areal half against bf16 strict",
        cfg,
        areal({"actor": {"dtype": "half"}}, PrecisionPolicy(dtype="bfloat16", strictness="error")),
        "trains in float16 (actor.dtype)",
        raises=PrecisionMismatchError,
    )
    bad(
        "areal switch maybe",
        cfg,
        areal({"actor": {"dtype": "half"}, "sglang": {"enable_fp32_lm_head": "maybe"}}),
        "sglang.enable_fp32_lm_head",
        "OmegaConf refuses",
    )
    bad(
        "areal typo",
        cfg,
        areal({"actor": {"dtype": "half", "bakend": "fsdp"}}),
        "did you mean 'actor.backend'",
    )
    bad(
        "verl check quoted bool",
        cfg,
        call("verl", "check_config", verl_cfg(calculate_log_probs="false"), "float16"),
        "calculate_log_probs in the verl config",
        "the string 'false'",
    )
    bad(
        "verl check typo",
        cfg,
        call("verl", "check_config", verl_cfg(dtpye="float16"), "float16"),
        "did you mean 'actor_rollout_ref.rollout.dtype'",
    )
    bad(
        "trl max_tokens 0",
        "generation",
        sampling(generation_kwargs={"max_tokens": 0}),
        "max_tokens",
        "at least 1",
    )
    bad(
        "trl max_tokens -5",
        "generation",
        sampling(generation_kwargs={"max_tokens": -5}),
        "max_tokens",
        "at least 1",
    )
    bad(
        "trl max_tokens 2.5",
        "generation",
        sampling(generation_kwargs={"max_tokens": 2.5}),
        "max_completion_length",
        "integer",
    )
    bad(
        "trl max_tokens '5'",
        "generation",
        sampling(generation_kwargs={"max_tokens": "5"}),
        "the string '5'",
    )
    bad(
        "trl max_completion_length None",
        "generation",
        sampling(max_completion_length=None),
        "max_completion_length",
        "None",
        ">= 1",
    )
    bad(
        "trl max_completion_length 0",
        "generation",
        sampling(max_completion_length=0),
        "max_completion_length",
        ">= 1",
    )
    bad(
        "trl max_completion_length True",
        "generation",
        sampling(max_completion_length=True),
        "a boolean",
    )
    bad(
        "trl generation_kwargs broken JSON",
        "generation",
        sampling(generation_kwargs='{"max_tokens": 5'),
        "generation_kwargs",
        "not valid JSON",
    )
    bad(
        "trl generation_kwargs JSON list",
        "generation",
        sampling(generation_kwargs="[5]"),
        "JSON list, not an object",
    )
    bad(
        "trl generation_kwargs 5",
        "generation",
        sampling(generation_kwargs=5),
        "generation_kwargs",
        "where a mapping belongs",
    )
    good(
        "trl generation_kwargs JSON text",
        "generation",
        sampling(generation_kwargs='{"max_tokens": 5}'),
        max_tokens_is(5),
    )
    good("trl max_tokens from the length", "generation", sampling(), max_tokens_is(8))

    # -- numbers: meaning declared with the type (precision_plugin._base.constraints) --------------------
    num = "numbers"
    inf, nan = math.inf, math.nan
    bad(
        "fit_growth infinite log-ratio",
        num,
        cons("fit_growth", [0.1, inf], [4, 8]),
        "'seq_log_ratio'",
        "inf",
        "finite",
    )
    bad(
        "fit_growth NaN log-ratio",
        num,
        cons("fit_growth", [nan, 0.1], [4, 8]),
        "'seq_log_ratio'",
        "NaN",
    )
    bad(
        "fit_growth bool length",
        num,
        cons("fit_growth", [0.1, 0.2], [True, 8]),
        "'seq_lengths'",
        "bool True",
    )
    bad(
        "fit_growth fractional length",
        num,
        cons("fit_growth", [0.1, 0.2], [4.5, 8]),
        "'seq_lengths'",
        "float 4.5",
    )
    bad(
        "fit_growth infinite k3",
        num,
        cons("fit_growth", [0.1, 0.2], [4, 8], seq_kl=[0.0, inf]),
        "'seq_kl'",
        "finite",
    )
    bad(
        "fit_growth clipped beyond tokens",
        num,
        cons("fit_growth", [0.1, 0.2], [4, 8], 13),
        "'clipped_tokens'",
        "more than the tokens of the sequences (12)",
    )
    bad("GrowthFit negative variance", num, growth(variance=-0.5), "'variance'", "-0.5", ">= 0")
    bad("GrowthFit infinite drift", num, growth(drift=inf), "'drift'", "finite")
    bad("GrowthFit negative stderr", num, growth(drift_stderr=-1.0), "'drift_stderr'", ">= 0")
    bad(
        "GrowthFit variance interval inverted",
        num,
        growth(variance_low=0.3, variance_high=0.1),
        "'variance_low' and 'variance_high'",
        "out of order",
    )
    bad(
        "GrowthFit tokens below sequences",
        num,
        growth(sequences=10, tokens=3),
        "'sequences' and 'tokens'",
        "out of order",
    )
    bad("GrowthFit bool sequences", num, growth(sequences=True), "'sequences'")
    good("GrowthFit of no sequence is NaN", num, cons("fit_growth", [], []), no_sequence)
    bad(
        "Interval low above high",
        num,
        cons("Interval", 0.5, 0.6, 0.4),
        "'low' and 'high'",
        "out of order",
        "high >= low",
    )
    bad("Interval infinite value", num, cons("Interval", inf, 0.0, 1.0), "'value'", "finite")
    good("Interval of NaNs", num, cons("Interval", nan, nan, nan), raises_not)
    bad(
        "drift_per_1k bool lengths",
        num,
        mism("drift_per_1k", [True, False], [0.1, 0.2]),
        "'lengths'",
        "a bool",
    )
    bad(
        "drift_per_1k bool tensor lengths",
        num,
        mism("drift_per_1k", torch.tensor([True, True]), [0.1, 0.2]),
        "'lengths'",
        "torch.bool",
    )
    bad(
        "drift_per_1k fractional lengths",
        num,
        mism("drift_per_1k", [1.5, 2.0], [0.1, 0.2]),
        "'lengths'",
        "not a whole number",
    )
    bad(
        "SequenceMask inverted bounds",
        num,
        cons("SequenceMask", "k", "s", "l", 2.0, 0.5, "x", "y"),
        "'low' and 'high'",
        "out of order",
    )
    bad(
        "SequenceMask zero low",
        num,
        cons("SequenceMask", "k", "s", "l", 0.0, 2.0, "x", "y"),
        "'low'",
        "> 0",
    )
    bad(
        "Consequence negative ess",
        num,
        cons("Consequence", -0.5, 0.0, 0.0, 0.0, 1, 1),
        "'ess'",
        ">= 0",
    )
    bad(
        "Consequence negative fraction",
        num,
        cons("Consequence", 0.9, -0.1, 0.0, 0.0, 1, 1),
        "'seq_mask_fraction_trl'",
        ">= 0",
    )
    bad("project length bool", num, project_length(True), "'length'")

    # -- servers -----------------------------------------------------------------------------------
    srv = "servers"
    good(
        "vllm nothing listening",
        srv,
        nothing_listens("vllm"),
        statuses("warning", says="nothing listens there"),
    )
    good(
        "sglang nothing listening",
        srv,
        nothing_listens("sglang"),
        statuses("warning", says="nothing listens there"),
    )
    good(
        "vllm 503 not ready",
        srv,
        server("vllm", 503, b"loading"),
        statuses("warning", says="listening but not ready (HTTP 503"),
    )
    good(
        "sglang 503 not ready",
        srv,
        server("sglang", 503),
        statuses("warning", says="listening but not ready"),
    )
    bad(
        "vllm 500 strict",
        srv,
        server("vllm", 500, b"boom"),
        "HTTP 500, an error inside the server",
        "'boom'",
        raises=PrecisionMismatchError,
    )
    good(
        "vllm 500 warn",
        srv,
        server("vllm", 500, b"boom", WARN),
        statuses("warning", says="HTTP 500"),
    )
    bad(
        "sglang 500 strict",
        srv,
        server("sglang", 500, b"boom"),
        "HTTP 500, an error inside",
        raises=PrecisionMismatchError,
    )
    good(
        "sglang 502 warn",
        srv,
        server("sglang", 502, b"", WARN),
        statuses("warning", says="HTTP 502"),
    )
    bad(
        "vllm truncated strict",
        srv,
        server("vllm", 200, b'{"vllm_config": ', length=400),
        "ended early",
        raises=PrecisionMismatchError,
    )
    good(
        "sglang truncated warn",
        srv,
        server("sglang", 200, b'{"dtype": ', WARN, length=400),
        statuses("warning", says="ended early"),
    )
    bad(
        "vllm html",
        srv,
        server("vllm", 200, b"<html>hi</html>", WARN),
        "not with JSON",
        "is this a vLLM server?",
        raises=ServerAnswerError,
    )
    bad(
        "sglang html",
        srv,
        server("sglang", 200, b"<html>hi</html>", WARN),
        "not with JSON",
        "is this an SGLang server?",
        raises=ServerAnswerError,
    )
    bad(
        "vllm answer of sglang",
        srv,
        server("vllm", 200, json.dumps({"dtype": "float16", "version": "0.5"}).encode(), WARN),
        "another program answers there",
        raises=ServerAnswerError,
    )
    bad(
        "sglang answer of vllm",
        srv,
        server("sglang", 200, json.dumps({"vllm_config": {}}).encode(), WARN),
        "without a 'dtype' field",
        raises=ServerAnswerError,
    )
    bad(
        "sglang 403",
        srv,
        server("sglang", 403, b"", WARN),
        "HTTP 403",
        "proxy or an authentication layer",
    )
    bad(
        "get_json timeout named",
        srv,
        get(200, delay=3.0),
        "within the 0.5 s timeout",
        raises=ServerUnreachableError,
    )
    bad(
        "get_json deep JSON",
        srv,
        get(200, DEEP.encode()),
        "nested too deeply",
        raises=ServerAnswerError,
    )

    # -- progress and small utilities ----------------------------------------------------------
    prog = "progress"
    good("progress NaN", prog, plain(("a", float("nan"), 10)), equals(["a ?/10"]))
    good("progress inf total", prog, plain(("a", 1, float("inf"))), equals(["a 1/?"]))
    good("progress None", prog, plain(("a", None, None)), equals(["a ?/?"]))
    good("progress negative", prog, plain(("a", -3, 10)), equals(["a ?/10"]))
    good("progress bool", prog, plain(("a", True, 10)), equals(["a ?/10"]))
    good(
        "progress broken pipe", prog, plain(("a", 1, 2), ("b", 2, 2), stream=_Broken()), equals([])
    )
    good("progress_reporter None", prog, reporter(None), equals(True))
    bad("progress_reporter a string", prog, reporter("stderr"), "expected a rich.console.Console")

    # -- deep structures -------------------------------------------------------------------------
    deep = "deep"
    bad(
        "env deep JSON object",
        deep,
        from_env(DEEP_OBJECT),
        "PRECISION_PLUGIN=",
        "deeper than 64 levels",
    )
    bad(
        "env JSON 65 levels", deep, from_env('{"a":' * 65 + "1" + "}" * 65), "deeper than 64 levels"
    )
    bad(
        "prompts deep array",
        deep,
        h.prompts_file("p.json", DEEP),
        "prompts:",
        "deeper than 64 levels",
    )
    bad(
        "prompts deep JSONL",
        deep,
        h.prompts_file("p.jsonl", DEEP_OBJECT + "\n"),
        "line 1",
        "deeper than 64 levels",
    )
    bad(
        "deepspeed deep JSON string",
        deep,
        ds_config(DEEP_OBJECT),
        "DeepSpeed config",
        "deeper than 64 levels",
    )
    bad(
        "deepspeed deep JSON file",
        deep,
        ds_config(DEEP_OBJECT, as_file=True),
        "ds.json",
        "deeper than 64 levels",
    )
    out.append(
        {
            "id": "cli doctor deep env",
            "cls": "cli",
            "run": h.cli("doctor"),
            "env": {"PRECISION_PLUGIN": DEEP_OBJECT},
            "names": ("PRECISION_PLUGIN=", "deeper than 64 levels"),
        }
    )
    out.append(
        {
            "id": "cli probe deep prompts",
            "cls": "cli",
            "run": h.cli("probe", "--prompts", lambda t: str(h.write(t, "deep.json", DEEP))),
            "names": ("prompts:", "deeper than 64 levels"),
        }
    )

    # -- output paths: refused before any work ----------------------------------------------------
    def prompts_path(t: Path) -> str:
        return str(h.write(t, "p.txt", "hello\n"))

    for cid, args, says in [
        (
            "cli probe json is the prompts",
            ("probe", "--prompts", prompts_path, "--json", prompts_path),
            ("--json", "the same file as the input --prompts"),
        ),
        (
            "cli probe plot is the json",
            ("probe", "--json", lambda t: str(t / "o.png"), "--plot", lambda t: str(t / "o.png")),
            ("--plot", "the same file as the output --json"),
        ),
        (
            "cli probe plot is the json via ..",
            (
                "probe",
                "--json",
                lambda t: str(t / "o.png"),
                "--plot",
                lambda t: str(t / "x" / ".." / "o.png"),
            ),
            ("--plot", "the same file as the output --json"),
        ),
        (
            "cli sanity plot is the json",
            ("sanity", "--json", lambda t: str(t / "s.png"), "--plot", lambda t: str(t / "s.png")),
            ("--plot", "the same file as the output --json"),
        ),
    ]:
        out.append({"id": cid, "cls": "cli", "run": h.cli(*args), "names": says})

    # -- the docs renderer -------------------------------------------------------------------------
    docs = "docs"
    bad(
        "render unclosed marker",
        docs,
        render("<!-- results: demo value:ratio -->47\n"),
        "line 1",
        "has no closing",
    )
    bad(
        "render stray closing",
        docs,
        render("x\n<!-- /results -->"),
        "line 2",
        "without its opening marker",
    )
    bad(
        "render missing file",
        docs,
        render("<!-- results: nosuch value:x -->1<!-- /results -->"),
        "nosuch.json does not exist",
    )
    bad(
        "render broken JSON",
        docs,
        render("<!-- results: b value:x -->1<!-- /results -->", {"b.json": "{"}),
        "b.json is not valid JSON",
    )
    bad(
        "render JSON list",
        docs,
        render("<!-- results: l value:x -->1<!-- /results -->", {"l.json": "[]"}),
        "holds a JSON list",
    )
    bad(
        "render unknown path",
        docs,
        render("<!-- results: demo value:nope -->1<!-- /results -->"),
        "KeyError: 'nope'",
    )
    bad(
        "render index out of range",
        docs,
        render("<!-- results: demo value:rows.3 -->1<!-- /results -->"),
        "IndexError",
    )
    bad(
        "render bad format",
        docs,
        render("<!-- results: demo value:ratio:.q -->1<!-- /results -->"),
        "cannot be rendered",
    )
    bad(
        "render bad scale",
        docs,
        render("<!-- results: demo value:ratio:*x:.1f -->1<!-- /results -->"),
        "cannot be rendered",
    )
    bad(
        "render unknown view",
        docs,
        render("<!-- results: demo nosuch -->1<!-- /results -->"),
        "unknown view 'nosuch'",
    )
    bad(
        "render view on wrong file",
        docs,
        render("<!-- results: demo provenance -->1<!-- /results -->"),
        "KeyError: 'provenance'",
    )
    bad(
        "render deep results",
        docs,
        render("<!-- results: d value:x -->1<!-- /results -->", {"d.json": DEEP}),
        "nested too deeply",
    )
    good(
        "render quoted marker is prose",
        docs,
        render("see `<!-- results: NAME VIEW -->`.\n"),
        equals("see `<!-- results: NAME VIEW -->`.\n"),
    )
    return out
