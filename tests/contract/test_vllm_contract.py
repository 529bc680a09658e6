"""precision_plugin against the real vLLM package, on CPU (config layer only, no weights)."""

from __future__ import annotations

import os
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_installed, script_command
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

import precision_plugin as pp
from precision_plugin import vllm as adapter
from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.patching import is_patched

ROOT = Path(__file__).resolve().parents[2]
VLLM_VERSION = adapter.vllm_version().version


#: DeviceConfig (create_engine_config(), the CLI parser's defaults) needs vLLM's CPU platform.
needs_cpu_platform = pytest.mark.skipif(
    VLLM_VERSION.release < (0, 11),
    reason="vLLM 0.10 picks its CPU platform only for a CPU build (or macOS), not from "
    "VLLM_TARGET_DEVICE: the CUDA wheel on CPU gets UnspecifiedPlatform, whose DeviceConfig "
    "fails ('Failed to infer device type' / 'Device string must not be empty')",
)


def engine_args(model: str, **kwargs) -> EngineArgs:
    return EngineArgs(model=model, skip_tokenizer_init=True, **kwargs)


def test_engine_kwargs_turn_a_bf16_checkpoint_into_fp16(llama_dir):
    kwargs = adapter.engine_kwargs({"model": llama_dir, "skip_tokenizer_init": True})
    assert kwargs["dtype"] == "float16"
    assert EngineArgs(**kwargs).create_model_config().dtype == torch.float16
    # without the plugin vLLM follows the checkpoint
    assert engine_args(llama_dir).create_model_config().dtype == torch.bfloat16


def test_engine_kwargs_pass_only_fields_the_installed_vllm_knows(llama_dir):
    fields = adapter.engine_arg_fields()
    assert fields is not None and "dtype" in fields
    force = pp.PrecisionPolicy.from_dict({"vllm": {"cascade_guard": "force"}})
    kwargs = adapter.engine_kwargs({"model": llama_dir, "disable_cascade_attn": True}, force)
    assert set(kwargs) <= set(fields)
    if adapter.cascade_guard(force).era == "removed":
        assert "disable_cascade_attn" not in kwargs


def test_refusal_table_matches_vllm():
    from precision_plugin.vllm.models import VLLM_FP16_REFUSED, vllm_refusal_table

    try:  # vLLM >= 0.11 keeps the table in vllm/config/model.py, 0.10.x in vllm/config/__init__.py
        from vllm.config import model as model_config
    except ImportError:
        import vllm.config as model_config

    assert vllm_refusal_table() == model_config._FLOAT16_NOT_SUPPORTED_MODELS
    if VLLM_VERSION.release >= (0, 31):  # the static table follows the current vLLM
        assert set(VLLM_FP16_REFUSED) == set(model_config._FLOAT16_NOT_SUPPORTED_MODELS)


def test_gemma2_is_refused_by_the_plugin_before_vllm(gemma2_dir):
    # vLLM itself refuses, deep in its config (a pydantic error wrapping a ValueError) ...
    with pytest.raises(Exception, match="does not support float16") as vllm_error:
        engine_args(gemma2_dir, dtype="float16").create_model_config()
    assert not isinstance(vllm_error.value, PrecisionConfigError)
    # ... the plugin stops first, with the fix.
    with pytest.raises(PrecisionConfigError, match="gemma2") as ours:
        adapter.check_model_config(gemma2_dir)
    pp.enable()
    with pytest.raises(PrecisionConfigError, match=r"'gemma2'.*dtype='bfloat16'") as enforced:
        engine_args(gemma2_dir).create_model_config()
    assert enforced.value.__cause__ is None  # raised before vLLM's validation ran
    assert "enable(dtype='bfloat16')" in str(ours.value)
    # consistent bf16 is fine
    pp.enable(dtype="bfloat16")
    assert engine_args(gemma2_dir).create_model_config().dtype == torch.bfloat16


def test_enable_enforces_colocated_engines_and_disable_restores(llama_dir):
    original = vars(EngineArgs)["create_model_config"]
    pp.enable()
    assert is_patched(vars(EngineArgs)["create_model_config"])
    assert os.environ["PRECISION_PLUGIN"].startswith("{")  # child processes get the policy
    # TRL's colocated LLM(...) passes no dtype
    assert engine_args(llama_dir).create_model_config().dtype == torch.float16
    assert AsyncEngineArgs(
        model=llama_dir, skip_tokenizer_init=True
    ).create_model_config().dtype == (torch.float16)
    pp.disable()
    assert vars(EngineArgs)["create_model_config"] is original
    assert "PRECISION_PLUGIN" not in os.environ
    assert engine_args(llama_dir).create_model_config().dtype == torch.bfloat16


def test_strict_policy_refuses_a_conflicting_dtype(llama_dir):
    pp.enable(strictness="error")
    with pytest.raises(PrecisionMismatchError, match="bfloat16"):
        engine_args(llama_dir, dtype="bfloat16").create_model_config()
    assert engine_args(llama_dir, dtype="half").create_model_config().dtype == torch.float16


@pytest.mark.skipif(VLLM_VERSION.release < (0, 32), reason="the flag is deprecated from 0.32")
@pytest.mark.parametrize("mode", ["auto", "force"])
def test_no_cascade_deprecation_warning(llama_dir, mode):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        engine_args(llama_dir, disable_cascade_attn=True).create_model_config()
    assert any("cascade" in str(w.message).lower() for w in seen)  # the check can see it
    pp.enable(vllm={"cascade_guard": mode})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        kwargs = adapter.engine_kwargs({"model": llama_dir, "skip_tokenizer_init": True})
        EngineArgs(**kwargs).create_model_config()
        # a user's deprecated flag (e.g. trl vllm-serve ... --disable-cascade-attn) is dropped
        engine_args(llama_dir, disable_cascade_attn=True).create_model_config()
    assert not [w for w in seen if "cascade" in str(w.message).lower()]


@needs_cpu_platform
def test_create_engine_config_on_cpu_and_server_info(llama_dir):
    import pydantic
    from vllm.config import VllmConfig

    pp.enable()
    config = engine_args(llama_dir, dtype="bfloat16").create_engine_config()
    assert config.model_config.dtype == torch.float16
    # exactly what GET /server_info?config_format=json returns as "vllm_config"
    info = pydantic.TypeAdapter(VllmConfig).dump_python(config, mode="json", fallback=str)
    assert info["model_config"]["dtype"] == "torch.float16"
    assert [f.status for f in adapter.verify_server(info)] == ["ok"]
    with pytest.raises(PrecisionMismatchError, match="learner runs bfloat16"):
        adapter.verify_server(info, pp.PrecisionPolicy(dtype="bfloat16", strictness="error"))


@needs_cpu_platform
@pytest.mark.parametrize("recipe", ["serve_vllm.sh", "serve_trl.sh"])
def test_serve_recipe_parses_with_vllms_cli(llama_dir, recipe):
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = script_command(
        ROOT / "integrations/vllm" / recipe, "vllm", {"MODEL": llama_dir, "PORT": "8123"}
    )
    assert argv[:2] == ["vllm", "serve"]
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args([*argv[1:], "--skip-tokenizer-init"])
    args.model = args.model_tag or args.model
    assert args.port == 8123 and args.logprobs_mode == "processed_logprobs"
    pp.enable()
    config = AsyncEngineArgs.from_cli_args(args).create_model_config()
    assert config.dtype == torch.float16


# -- the general plugin, installed as a real distribution, in fresh processes ----------------
PROBE = textwrap.dedent(
    """
    import precision_plugin
    from vllm.engine.arg_utils import EngineArgs
    args = EngineArgs(model={model!r}, dtype="bfloat16", skip_tokenizer_init=True)
    print("FILE", precision_plugin.__file__)
    print("DTYPE", args.create_model_config().dtype)
    """
)


def _run(model: str, tmp_path: Path, **env: str) -> dict[str, str]:
    return run_installed(PROBE.format(model=model), tmp_path, **env)


@pytest.mark.slow
def test_general_plugin_enforces_with_env(llama_dir, tmp_path):
    out = _run(llama_dir, tmp_path, PRECISION_PLUGIN="float16")
    assert out["DTYPE"] == "torch.float16"


@pytest.mark.slow
def test_general_plugin_does_nothing_without_env(llama_dir, tmp_path):
    assert _run(llama_dir, tmp_path)["DTYPE"] == "torch.bfloat16"


@pytest.mark.slow
def test_general_plugin_respects_vllm_plugins(llama_dir, tmp_path):
    out = _run(
        llama_dir, tmp_path, PRECISION_PLUGIN="float16", VLLM_PLUGINS="lora_filesystem_resolver"
    )
    assert out["DTYPE"] == "torch.bfloat16"


def test_general_plugin_is_idempotent(llama_dir, monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    adapter.general_plugin()
    first = vars(EngineArgs)["create_model_config"]
    adapter.general_plugin()
    adapter.general_plugin()
    assert vars(EngineArgs)["create_model_config"] is first
    assert engine_args(llama_dir).create_model_config().dtype == torch.float16
    monkeypatch.delenv("PRECISION_PLUGIN")
    # the env-var patch stays for the process, but without a policy it passes through
    assert engine_args(llama_dir).create_model_config().dtype == torch.bfloat16


@pytest.mark.slow
def test_enable_before_vllm_import_reaches_engines_whatever_vllm_plugins(llama_dir, tmp_path):
    """enable() does not wait for vLLM's general plugin (loaded once, and only if allowed)."""
    code = textwrap.dedent(
        f"""
        import sys
        import precision_plugin as pp
        pp.enable()
        print("FILE", pp.__file__)
        print("IMPORTED", "vllm" in sys.modules)
        from vllm.engine.arg_utils import EngineArgs
        args = EngineArgs(model={llama_dir!r}, skip_tokenizer_init=True)
        print("ON", args.create_model_config().dtype)
        pp.disable()
        args = EngineArgs(model={llama_dir!r}, skip_tokenizer_init=True)
        print("OFF", args.create_model_config().dtype)
        """
    )
    # precision_plugin is not in vLLM's plugin allow-list
    out = run_installed(code, tmp_path, VLLM_PLUGINS="lora_filesystem_resolver")
    assert out["IMPORTED"] == "False"
    assert out["ON"] == "torch.float16"
    assert out["OFF"] == "torch.bfloat16"
