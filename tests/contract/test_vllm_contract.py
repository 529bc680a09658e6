"""precision_plugin against the real vLLM package, on CPU (config layer only, no weights)."""

from __future__ import annotations

import dataclasses
import os
import re
import textwrap
import typing
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_installed, script_command
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

import precision_plugin as pp
from precision_plugin import vllm as adapter
from precision_plugin._base.patching import is_patched
from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE
from tests.rope_variants import SCALED, rope_parameters

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


# -- the attribution's fixes (CAUSE_TABLE), in vLLM's own spellings -----------------------------
def _in_table(pattern: str, framework: str | None = None) -> list[tuple[str, ...]]:
    """Every match of ``pattern`` in the table's ``framework`` strings (all strings if None)."""
    return [
        m.groups()
        for cause in CAUSE_TABLE.values()
        for name, text in cause.fixes.items()
        if framework in (None, name)
        for m in re.finditer(pattern, text)
    ]


@needs_cpu_platform  # vLLM 0.10's serve parser builds a DeviceConfig ('Failed to infer device type')
def test_fixes_table_vllm_flags_parse_with_vllms_cli(llama_dir):
    """Users copy the attribution's vLLM fixes into ``vllm serve``: every flag is a serve option
    and its value (the word after it) one vLLM takes, checked by parsing them and building the
    engine config (a misspelt flag passed every test before)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    found = _in_table(r"(--[a-z0-9][a-z0-9-]*)(?: ([\w.]+))?", "vLLM")
    assert {flag for flag, _ in found} == {"--dtype", "--kv-cache-dtype"}
    parser = FlexibleArgumentParser()
    subparsers = parser.add_subparsers(dest="subcommand")
    ServeSubcommand().subparser_init(subparsers)
    actions = {o: a for a in subparsers.choices["serve"]._actions for o in a.option_strings}
    assert sorted(flag for flag, _ in found if flag not in actions) == []
    argv = [part for flag, value in found for part in (flag, value) if part]
    args = parser.parse_args(["serve", llama_dir, "--skip-tokenizer-init", *argv])
    args.model = args.model_tag or args.model
    valued = {flag: value for flag, value in found if value}
    assert {f: getattr(args, actions[f].dest) for f in valued} == valued
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()  # validates the values
    assert (config.model_config.dtype, config.cache_config.cache_dtype) == (torch.float16, "auto")


@pytest.mark.skipif(
    VLLM_VERSION.release < (0, 11),
    reason="vLLM 0.10.1 has no VLLM_BATCH_INVARIANT yet (batch-invariant kernels came later)",
)
def test_fixes_table_vllm_env_vars_are_vllms():
    """The attribution's fixes name vLLM environment variables (VLLM_BATCH_INVARIANT=1 in the
    vLLM and verl advice) users set by hand: each is one vLLM reads (vllm.envs); a
    misspelt name is silently ignored by vLLM and passed every test before."""
    import vllm.envs

    names = {name for (name,) in _in_table(r"\b(VLLM_[A-Z0-9_]+)")}
    assert sorted(names - set(vllm.envs.environment_variables)) == []
    assert names == {"VLLM_BATCH_INVARIANT"}


def test_fixes_table_logprobs_mode_and_sampling_are_vllms():
    """The attribution's sampling fix (logprobs_mode=processed_logprobs with top_p=1.0, top_k=-1)
    is copied into vLLM settings: the mode is one of EngineArgs.logprobs_mode's values and the
    sampling values are SamplingParams vLLM accepts."""
    from vllm import SamplingParams

    field = {f.name: f for f in dataclasses.fields(EngineArgs)}["logprobs_mode"]
    modes = {mode for (mode,) in _in_table(r"\blogprobs_mode=(\w+)")}
    assert modes == {"processed_logprobs"} and modes <= set(typing.get_args(field.type))
    sampling = dict(_in_table(r"\b(top_[pk])=(-?[\d.]+)", "vLLM"))
    assert sampling == {"top_p": "1.0", "top_k": "-1"}
    params = SamplingParams(top_p=float(sampling["top_p"]), top_k=int(sampling["top_k"]))
    assert (params.top_p, params.top_k) == (1.0, -1)


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


# -- the rollout copy computes what vLLM computes (exact, vLLM 0.33) -----------------------------
#: Exact comparisons follow the current vLLM's code (its sampler and RoPE modules moved since 0.10).
current_vllm_only = pytest.mark.skipif(
    VLLM_VERSION.release < (0, 33), reason="exact comparisons against vLLM 0.33's code"
)

ROPE = ["default", *SCALED]


@needs_cpu_platform
@current_vllm_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("rope_type", sorted(ROPE))
def test_rollout_copy_cos_sin_equal_vllms_cache(llama_dir, rope_type, dtype):
    """cos/sin of the rollout copy (precision_plugin._core.buffers.cast_model) at positions 0..511
    equal vLLM's cos_sin_cache bit for bit; a plain .to(dtype) copy does not."""
    import copy

    import transformers
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from precision_plugin._core.buffers import cast_model

    params = rope_parameters(rope_type)
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=512, rope_parameters=params,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    # vLLM's longrope reads max_model_len from the current config
    with set_current_vllm_config(engine_args(llama_dir).create_engine_config()):
        vllm_rope = get_rope(16, 512, True, rope_parameters=dict(params), dtype=dtype)
    if rope_type == "longrope":  # its short rows, then its long rows (used past 128)
        cache = vllm_rope.long_short_cos_sin_cache
        windows = [(128, cache[:128]), (512, cache[128 : 128 + 512])]
    else:  # (positions, vLLM's rows for them)
        windows = [(512, vllm_rope.cos_sin_cache[:512])]

    def cos_sin(rotary: torch.nn.Module, length: int) -> torch.Tensor:
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1, dtype=dtype), torch.arange(length)[None])
        return torch.cat([cos[0, :, :8], sin[0, :, :8]], dim=-1)  # vLLM keeps half of each

    ours = cast_model(copy.deepcopy(model), dtype).model.rotary_emb
    plain = copy.deepcopy(model).to(dtype).model.rotary_emb
    for length, expected in windows:
        got = cos_sin(ours, length)
        assert got.dtype == expected.dtype == dtype and torch.equal(got, expected), length
    # the rounded frequencies of a plain .to(dtype): a quarter and more of the entries differ
    length, expected = windows[0]
    assert (cos_sin(plain, length) != expected).sum() > expected.numel() // 4


SAMPLING = [
    {"temperature": 0.7},
    {"top_p": 0.8},
    {"top_k": 5},
    {"min_p": 0.05},
    {"repetition_penalty": 1.5},
    {"frequency_penalty": 0.5, "presence_penalty": 0.3},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.02, "repetition_penalty": 1.3,
     "frequency_penalty": 0.5, "presence_penalty": 0.25},
]  # fmt: skip


def _vllm_logprobs(logits, prompts, outputs, settings):
    """vLLM's own Sampler (V1) on CPU, full log-probs in the settings' logprobs_mode."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    rows, vocab = logits.shape

    def f32(value: float) -> torch.Tensor:
        return torch.full((rows,), value, dtype=torch.float32)

    processors = []
    if settings.min_p > 0:  # the batch state InputBatch would give it, set directly
        min_p = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
        min_p.min_p_count, min_p.min_p = rows, torch.full((rows, 1), settings.min_p)
        processors.append(min_p)
    width = max(map(len, prompts))
    top_k = settings.top_k if 0 < settings.top_k < vocab else None
    meta = SamplingMetadata(
        temperature=f32(settings.temperature),
        all_greedy=False,
        all_random=True,
        top_p=f32(settings.top_p) if settings.top_p < 1 else None,
        top_k=None if top_k is None else torch.full((rows,), top_k, dtype=torch.int32),
        generators={},
        max_num_logprobs=-1,  # the whole distribution
        no_penalties=not settings.penalties,
        prompt_token_ids=torch.tensor([p + [vocab] * (width - len(p)) for p in prompts]),
        frequency_penalties=f32(settings.frequency_penalty),
        presence_penalties=f32(settings.presence_penalty),
        repetition_penalties=f32(settings.repetition_penalty),
        output_token_ids=[list(o) for o in outputs],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(processors),
    )
    # fp64 Gumbel noise: the CPU path without vLLM's compiled _C sampler
    sampler = Sampler(logprobs_mode=settings.logprobs_mode, use_fp64_gumbel=True)
    return sampler(logits.clone(), meta).logprobs_tensors.logprobs


@needs_cpu_platform
@current_vllm_only
@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("settings", SAMPLING, ids=lambda s: ",".join(s))
def test_sampling_log_probs_equal_vllms_sampler(llama_dir, settings, dtype, mode):
    """The HF engine's processing (precision_plugin._core.sampling) gives the log-probs vLLM's V1
    Sampler reports, bit for bit, in both logprobs modes."""
    from vllm.config import set_current_vllm_config

    from precision_plugin._core.sampling import LogitsProcessor, SamplingSettings

    ours = SamplingSettings(**settings, logprobs_mode=mode)
    prompts, outputs = [[1, 5, 9, 9], [2, 7], [3, 30, 31, 5, 40]], [[5, 5, 6], [8, 8, 2], [9, 9, 1]]
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 64, generator=generator)).to(dtype)
    processor = LogitsProcessor(ours, prompts, 64, "cpu")
    for t in range(3):
        processor.add(torch.tensor([[o[t]] for o in outputs]))
    processed = processor.process(logits)
    expected = processed if mode == "processed_logprobs" else logits
    with set_current_vllm_config(engine_args(llama_dir).create_engine_config()):
        theirs = _vllm_logprobs(logits, prompts, outputs, ours)
    assert torch.equal(expected.log_softmax(dim=-1, dtype=torch.float32), theirs)


@needs_cpu_platform
def test_audit_reads_colocated_vllm_where_vllm_keeps_its_dtype(llama_dir):
    """TRL keeps a colocated engine as ``trainer.vllm_generation.llm`` (an ``LLM``); vLLM's
    ``LLM.__init__`` sets ``llm_engine`` and ``LLMEngine.__init__`` sets ``vllm_config``: the
    audit reads the real VllmConfig's model_config.dtype through them."""
    import inspect
    from types import SimpleNamespace

    from vllm import LLM

    from precision_plugin.audit import rollout_side

    try:  # vLLM >= 0.11 (V1 only)
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError:  # pragma: no cover
        from vllm.engine.llm_engine import LLMEngine

    assert "self.llm_engine = LLMEngine.from_engine_args(" in inspect.getsource(LLM.__init__)
    assert "self.vllm_config = vllm_config" in inspect.getsource(LLMEngine.__init__)
    config = engine_args(llama_dir, dtype="bfloat16").create_engine_config()
    engine = object.__new__(LLMEngine)
    engine.vllm_config = config  # what LLMEngine.__init__ sets, from the real engine config
    llm = object.__new__(LLM)
    llm.llm_engine = engine
    trainer = SimpleNamespace(
        use_vllm=True,
        rollout_func=None,
        args=SimpleNamespace(vllm_mode="colocate"),
        vllm_generation=SimpleNamespace(llm=llm),
    )
    assert rollout_side(trainer) == {"engine": "vLLM (colocate)", "dtype": "bfloat16"}
