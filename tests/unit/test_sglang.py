"""precision_plugin.sglang's pure parts: spelling, launch arguments, the launch check and its
traps, /server_info, the entry point's hooks on stand-in records, slime, AReaL and verl's
SGLang rollout. The real SGLang runs in tests/contract_sglang/ (its own environment)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionMismatchError, PrecisionPolicy
from precision_plugin._core.frameworks import SGLANG_DTYPE_CHOICES, sglang_dtype, sglang_runs
from precision_plugin.areal import areal_overrides, check_areal_config
from precision_plugin.sglang import (
    auto_dtype,
    check_server_args,
    read_server_args,
    server_args,
    verify_server,
)
from precision_plugin.sglang.args import FIELDS, env_value
from precision_plugin.sglang.checkpoint import is_dsa
from precision_plugin.sglang.doctor import doctor_findings
from precision_plugin.sglang.plugin import force_dtype, resolve_target, verify_model_config
from precision_plugin.slime import check_slime_args, slime_args
from precision_plugin.verl import check_config, overrides
from precision_plugin.verl.sglang import rollout_dtype_key
from tests.loopback import Answer, loopback

STRICT = PrecisionPolicy(strictness="error")
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16"}


@pytest.fixture
def checkpoint(tmp_path):
    def write(config: dict, name: str = "ck") -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return str(folder)

    return write


def statuses(findings) -> list[tuple[str, str]]:
    return [(f.status, f.message.split(":")[0]) for f in findings]


# -- spelling and launch arguments ---------------------------------------------------------------
def test_sglang_spelling():
    assert [sglang_dtype(PrecisionPolicy(dtype=d)) for d in ("fp16", "bf16", "fp32")] == [
        "float16",
        "bfloat16",
        "float32",
    ]
    assert {k: sglang_runs(k) for k in SGLANG_DTYPE_CHOICES} == {
        "auto": None,
        "half": "float16",
        "float16": "float16",
        "bfloat16": "bfloat16",
        "float": "float32",
        "float32": "float32",
    }
    assert sglang_runs(None) is None and sglang_runs(" BFloat16 ") == "bfloat16"
    with pytest.raises(PrecisionConfigError, match=r"SGLang dtype \(value\): got dict"):
        sglang_runs({"dtype": "float16"})  # its repr named neither the parameter nor a dtype
    with pytest.raises(PrecisionConfigError, match="never 'fp16'"):
        sglang_runs("fp16")
    with pytest.raises(PrecisionConfigError, match=r"'torch\.float16' is not one SGLang accepts"):
        sglang_runs("torch.float16")  # the string: SGLang's _get_and_verify_dtype refuses it
    # a torch dtype object it takes as it is (sglang.Engine(dtype=torch.float16))
    assert [sglang_runs(d) for d in (torch.float16, torch.bfloat16, torch.float32)] == [
        "float16",
        "bfloat16",
        "float32",
    ]
    assert sglang_runs(torch.float64) == "float64"  # runs, and is no policy dtype
    assert [f.status for f in check_server_args({"dtype": torch.float16}, STRICT)] == ["ok"]
    with pytest.raises(PrecisionMismatchError, match=r"runs bfloat16 \(dtype=torch.bfloat16\)"):
        check_server_args({"dtype": torch.bfloat16}, STRICT)


def test_server_args_for_each_dtype():
    launch = server_args("bf16")
    assert launch.flags == ("--dtype", "bfloat16", "--kv-cache-dtype", "auto")
    assert launch.kwargs == {"dtype": "bfloat16", "kv_cache_dtype": "auto"}
    assert launch.env == {"PRECISION_PLUGIN": "bfloat16"}
    strict = server_args(STRICT)
    assert strict.env == {"PRECISION_PLUGIN": STRICT.to_json()}
    assert PrecisionPolicy.from_env(strict.env) == STRICT
    assert env_value(PrecisionPolicy(dtype="float32")) == "float32"


def test_server_args_follows_the_env_var(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "bfloat16")
    assert server_args().kwargs["dtype"] == "bfloat16"
    with pytest.raises(PrecisionConfigError, match="server_args"):
        server_args(3.5)  # type: ignore[arg-type]


def test_read_server_args_every_form(tmp_path):
    argv = ["--model", "/m", "--dtype=half", "--rl-on-policy-target", "fsdp", "--port", "1"]
    want = {**FIELDS, "model_path": "/m", "dtype": "half", "rl_on_policy_target": "fsdp"}
    assert read_server_args(argv) == want
    assert (
        read_server_args({"model_path": "/m", "dtype": "half", "rl-on-policy-target": "fsdp"})
        == want
    )
    assert read_server_args(argparse.Namespace(**want)) == want
    config = tmp_path / "c.yaml"
    config.write_text("dtype: bfloat16\nenable-fp32-lm-head: true\nspeculative-eagle-topk: 4\n")
    got = read_server_args(["--config", str(config), "--model-path", "/m"])
    assert (got["dtype"], got["enable_fp32_lm_head"], got["speculative_eagle_topk"]) == (
        "bfloat16",
        True,
        4,
    )
    assert read_server_args(["--dtype", "float16", "--config", str(config)])["dtype"] == "float16"
    for bad in ("--dtype float16", 5, None):
        with pytest.raises(PrecisionConfigError, match=r"read_server_args\(\): argument 'args'"):
            read_server_args(bad)
    with pytest.raises(PrecisionConfigError, match="--config"):
        read_server_args(["--config", str(tmp_path / "missing.yaml")])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model-path", "/m", "--dtype"], "argument --dtype: expected one argument"),
        (["--model"], "argument --model-path/--model: expected one argument"),
        (["--speculative-eagle-topk", "x"], "argument --speculative-eagle-topk: invalid int"),
    ],
)
def test_a_command_line_sglang_would_refuse_is_an_error_not_an_exit(argv, says):
    """argparse would print its usage and exit the caller's process."""
    with pytest.raises(PrecisionConfigError) as err:
        check_server_args(argv, STRICT)
    assert str(err.value).startswith(
        f"the command line cannot be read as the framework would read it: {says}"
    )
    assert str(err.value).endswith(
        "(e.g. a flag at the end without its value); pass the arguments exactly as launched."
    )
    with pytest.raises(PrecisionConfigError, match="argument --sglang-dtype: expected one"):
        check_slime_args(["--fp16", "--sglang-dtype"], STRICT)


def test_a_topk_sglang_would_refuse_is_named():
    fields = {"dtype": "float16", "speculative_algorithm": "EAGLE", "speculative_eagle_topk": "x"}
    with pytest.raises(PrecisionConfigError) as err:
        check_server_args(fields, STRICT)
    assert str(err.value).startswith(
        "SGLang: speculative_eagle_topk in the keyword arguments is the string 'x', where an "
        "integer belongs"
    )
    # ServerArgs(**kwargs) converts nothing: a string of digits is compared with ints later.
    fields["speculative_eagle_topk"] = "4"
    with pytest.raises(PrecisionConfigError, match="the string '4'"):
        check_server_args(fields, STRICT)
    fields["speculative_eagle_topk"] = 4
    assert [f.status for f in check_server_args(fields)] == ["ok", "warning"]
    # on the command line argparse's int() reads the text
    argv = ["--dtype", "float16", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk"]
    assert [f.status for f in check_server_args([*argv, "4"])] == ["ok", "warning"]
    with pytest.raises(PrecisionConfigError, match="invalid int value: 'x'"):
        check_server_args([*argv, "x"], STRICT)


# -- what SGLang makes of a checkpoint -----------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "want"),
    [
        ({"torch_dtype": "bfloat16", "model_type": "llama"}, "bfloat16"),
        ({"torch_dtype": "float16", "model_type": "llama"}, "float16"),
        ({"dtype": "float16", "torch_dtype": "bfloat16"}, "float16"),
        ({"torch_dtype": "float32", "model_type": "llama"}, "float16"),
        ({"model_type": "llama"}, "float16"),
        ({"torch_dtype": "float32", "model_type": "gemma3_text"}, "bfloat16"),
        ({"torch_dtype": "float8_e4m3fn", "model_type": "gemma"}, "bfloat16"),
        ({"text_config": {"model_type": "qwen2", "torch_dtype": "bfloat16"}}, "bfloat16"),
        ({"torch_dtype": "bfloat16", "text_config": {"model_type": "gemma3_text"}}, "bfloat16"),
        ({"torch_dtype": "float32", "text_config": {"model_type": "llama"}}, "float16"),
    ],
)
def test_auto_dtype(config, want):
    assert auto_dtype(config) == want


@pytest.mark.parametrize("name", ["BF16", "Float16", "fp16", "bf16"])
def test_a_dtype_name_transformers_cannot_read_is_named_not_guessed(name):
    # transformers reads config.json's dtype with getattr(torch, name): these fail there, so
    # SGLang cannot load the checkpoint; neither float16 nor bfloat16 would be the truth.
    with pytest.raises(PrecisionConfigError, match=f"declares dtype '{name}', which is no torch"):
        auto_dtype({"torch_dtype": name, "model_type": "llama"})


def test_dsa_needs_the_architecture_and_index_topk():
    assert is_dsa({"architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048})
    assert not is_dsa({"architectures": ["DeepseekV32ForCausalLM"]})
    assert not is_dsa({"architectures": ["LlamaForCausalLM"], "index_topk": 2048})


# -- the launch check ----------------------------------------------------------------------------
def test_auto_is_decided_from_the_checkpoint(checkpoint):
    path = checkpoint(LLAMA)
    (finding,) = check_server_args(["--model-path", path], "bfloat16")
    assert finding.status == "ok" and "runs bfloat16 (dtype=auto, decided" in finding.message
    with pytest.raises(PrecisionMismatchError, match=r"runs bfloat16 \(dtype=auto"):
        check_server_args(["--model-path", path], STRICT)
    assert [f.status for f in check_server_args({"model_path": path, "dtype": "half"})] == ["ok"]


def test_auto_without_the_checkpoint_cannot_be_told(tmp_path):
    (finding,) = check_server_args({"model_path": str(tmp_path / "elsewhere")}, STRICT)
    assert finding.status == "warning" and "cannot be told here" in finding.message


def test_a_bf16_architecture_is_an_error_whatever_dtype(checkpoint):
    path = checkpoint({"architectures": ["MistralLarge3ForCausalLM"], "torch_dtype": "bfloat16"})
    with pytest.raises(PrecisionMismatchError, match="runs MistralLarge3ForCausalLM in bfloat16"):
        check_server_args({"model_path": path, "dtype": "float16"}, STRICT)


TRAPS = [
    ({"rl_on_policy_target": "fsdp"}, {}, "error", "rl-on-policy-target fsdp"),
    ({}, {"SGLANG_SANITIZE_NAN_LOGITS": "True"}, "error", "SGLANG_SANITIZE_NAN_LOGITS=True"),
    ({"kv_cache_dtype": "bf16"}, {}, "error", "KV cache in bfloat16"),
    ({"kv_cache_dtype": "fp8_e4m3"}, {}, "warning", "KV cache as fp8_e4m3"),
    ({"attention_backend": "hpc_ops"}, {}, "error", "--attention-backend hpc_ops"),
    ({"moe_runner_backend": "hpc_ops"}, {}, "error", "--moe-runner-backend hpc_ops"),
    ({"decode_attention_backend": "trtllm_mla"}, {}, "warning", "trtllm_mla attention backend"),
    (
        {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4},
        {},
        "warning",
        "--speculative-eagle-topk 4",
    ),
]


@pytest.mark.parametrize(("fields", "environ", "status", "says"), TRAPS)
def test_each_trap_under_float16(fields, environ, status, says):
    found = check_server_args({"dtype": "float16", **fields}, environ=environ)
    assert [f.status for f in found] == ["ok", status]
    assert says in found[1].message


@pytest.mark.parametrize(("fields", "environ", "status", "says"), TRAPS)
def test_no_trap_under_bfloat16_but_fp8(fields, environ, status, says):
    found = check_server_args({"dtype": "bfloat16", **fields}, "bfloat16", environ=environ)
    fp8 = fields.get("kv_cache_dtype") == "fp8_e4m3"
    assert [f.status for f in found] == (["ok", "warning"] if fp8 else ["ok"])


def test_strict_raises_every_error_at_once():
    fields = {"dtype": "bfloat16", "rl_on_policy_target": "fsdp", "kv_cache_dtype": "bfloat16"}
    with pytest.raises(PrecisionMismatchError) as err:
        check_server_args(fields, STRICT, environ={"SGLANG_SANITIZE_NAN_LOGITS": "1"})
    text = str(err.value)
    for says in ("runs bfloat16", "rl-on-policy-target", "SANITIZE", "KV cache in bfloat16"):
        assert says in text
    assert text.endswith("(strictness='error')")
    with pytest.raises(PrecisionConfigError, match=r"check_server_args\(\): argument 'environ'"):
        check_server_args(fields, environ=["SGLANG_SANITIZE_NAN_LOGITS"])  # type: ignore[arg-type]


def test_checkpoint_risks_sglang_does_not_refuse(checkpoint):
    gemma2 = checkpoint({**LLAMA, "model_type": "gemma2"}, "gemma2")
    found = check_server_args({"model_path": gemma2, "dtype": "float16"})
    assert [f.status for f in found] == ["ok", "warning"]
    assert found[1].framework == "sglang" and "SGLang does not refuse it" in found[1].message
    moe = checkpoint({**LLAMA, "model_type": "qwen3_moe"}, "moe")
    found = check_server_args({"model_path": moe, "dtype": "float16"})
    assert "known to overflow float16" in found[1].message
    assert [f.status for f in check_server_args({"model_path": moe}, "bfloat16")] == ["ok"]


# -- /server_info --------------------------------------------------------------------------------
@pytest.fixture
def server():
    with loopback(Answer("/server_info")) as answer:
        yield answer


def answer(**fields) -> bytes:
    """What SGLang's /server_info holds: every resolved field plus version and launch command."""
    return json.dumps({**FIELDS, "version": "0.5.23", "launch_command": "...", **fields}).encode()


def test_verify_server_over_http(server, checkpoint):
    server.set(answer(dtype="bfloat16", model_path=checkpoint(LLAMA)))
    with pytest.raises(
        PrecisionMismatchError, match=r"at http://127.0.0.1:\d+ \(SGLang 0.5.23\) runs bfloat16"
    ):
        verify_server(server.url + "/", STRICT)
    assert [f.status for f in verify_server(server.url, "bfloat16")] == ["ok"]
    server.set(
        answer(dtype="auto", model_path=checkpoint({**LLAMA, "torch_dtype": "float32"}, "fp32"))
    )
    assert [f.status for f in verify_server(server.url, STRICT)] == ["ok"]  # auto: fp32 -> fp16


def test_verify_server_traps_and_json(checkpoint):
    info = json.loads(answer(dtype="float16", kv_cache_dtype="fp8_e5m2"))
    assert [f.status for f in verify_server(info)] == ["ok", "warning"]
    with pytest.raises(PrecisionConfigError, match=r"verify_server\(\): argument 'url'"):
        verify_server(5)  # type: ignore[arg-type]


def test_verify_server_refuses_json_that_is_not_server_info():
    for info in ({}, {"vllm_config": {}}):
        with pytest.raises(PrecisionConfigError) as err:
            verify_server(info, STRICT)
        assert "which has no 'dtype' key (SGLang's /server_info answer always has one)" in str(
            err.value
        )


def test_verify_server_wrong_answers(server):
    with pytest.raises(PrecisionConfigError, match="HTTP 404: it is not an SGLang server"):
        verify_server(server.url + "/v1")
    server.set(b"<html>")
    with pytest.raises(PrecisionConfigError, match="not with JSON"):
        verify_server(server.url)
    server.set(json.dumps({"vllm_config": {}}).encode())
    with pytest.raises(PrecisionConfigError, match="without a 'dtype' field"):
        verify_server(server.url)


def test_verify_server_with_nothing_listening(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        (finding,) = verify_server("http://127.0.0.1:9", STRICT)
    assert finding.status == "warning"
    assert "Is an SGLang server running at http://127.0.0.1:9?" in finding.message
    assert "Is an SGLang server running" in caplog.text


# -- the entry point's hooks, on stand-in records ------------------------------------------------
def test_resolve_target_by_sglang_generation():
    class Struct:  # >= 0.5.20
        def resolve_once(self): ...

        def __post_init__(self): ...

    class Dataclass:  # 0.5.12 - 0.5.19: construction resolves
        def __post_init__(self): ...

    prefix = "sglang.srt.server_args.ServerArgs."
    assert resolve_target(Struct) == prefix + "resolve_once"
    assert resolve_target(Dataclass) == prefix + "__post_init__"
    with pytest.raises(PrecisionConfigError, match="cannot set the dtype"):
        resolve_target(object)


def record(**fields):
    return SimpleNamespace(**{**FIELDS, "model_path": "/nowhere", **fields})


def test_force_dtype(caplog):
    auto = record()
    force_dtype(auto, PrecisionPolicy())
    assert auto.dtype == "float16"
    explicit = record(dtype="bfloat16")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        force_dtype(explicit, PrecisionPolicy())
    assert explicit.dtype == "float16" and "contradicts the policy dtype float16" in caplog.text
    with pytest.raises(PrecisionMismatchError, match="--dtype bfloat16"):
        force_dtype(record(dtype="bfloat16"), STRICT)
    half = record(dtype="half")
    force_dtype(half, STRICT)
    assert half.dtype == "half"  # already float16
    done = record(dtype="bfloat16", _resolution_finished=True)
    force_dtype(done, STRICT)
    assert done.dtype == "bfloat16"  # sealed: the verify hook answers for it
    with pytest.raises(PrecisionMismatchError, match="rl-on-policy-target"):
        force_dtype(record(rl_on_policy_target="fsdp"), STRICT)


def test_the_verify_hook_checks_the_traps_of_a_record_resolved_before_it(monkeypatch, caplog):
    """verl, slime and AReaL resolve the record before plugins load: the force hook never sees
    it, so the verify hook (in the main process and each scheduler) checks its traps."""
    from precision_plugin.sglang import plugin

    monkeypatch.setattr(plugin, "_logged_traps", set())
    monkeypatch.delenv("SGLANG_SANITIZE_NAN_LOGITS", raising=False)
    built = SimpleNamespace(dtype=torch.float16)
    on_policy = record(dtype="float16", rl_on_policy_target="fsdp")
    monkeypatch.setenv("PRECISION_PLUGIN", json.dumps({"dtype": "float16", "strictness": "error"}))
    with pytest.raises(PrecisionMismatchError) as err:
        plugin._after_model_config(built, on_policy)
    assert str(err.value).startswith(
        "the SGLang launch has --rl-on-policy-target fsdp: SGLang then computes the LM-head "
        "logits and the log-probs in bfloat16"
    )
    assert str(err.value).endswith("(strictness='error')")
    plugin._after_model_config(built, record(dtype="float16"))  # no trap: nothing raised
    plugin._after_model_config(built, on_policy, is_draft_model=True)  # the draft: dtype only
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    monkeypatch.setenv("SGLANG_SANITIZE_NAN_LOGITS", "1")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        plugin._after_model_config(built, record(dtype="float16"))
        plugin._after_model_config(built, record(dtype="float16"))
    assert caplog.text.count("SGLANG_SANITIZE_NAN_LOGITS=1 makes SGLang replace NaN/inf") == 1


def test_verify_model_config(caplog):
    bf16 = SimpleNamespace(dtype=torch.bfloat16)
    with pytest.raises(PrecisionMismatchError, match="runs bfloat16, but the policy is float16"):
        verify_model_config(bf16, STRICT)
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        verify_model_config(bf16, PrecisionPolicy(), draft=True)
        verify_model_config(bf16, PrecisionPolicy(), draft=True)
    assert caplog.text.count("draft model") == 1  # once per process
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        verify_model_config(bf16, "bfloat16" and PrecisionPolicy(dtype="bfloat16"))
    assert caplog.text == ""


def test_the_entry_point_module_imports_no_sglang():
    assert "sglang" not in sys.modules
    import precision_plugin.sglang.plugin  # noqa: F401

    assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)


# -- slime -----------------------------------------------------------------------------------------
def test_slime_args():
    assert slime_args("fp16") == ["--fp16"]
    assert slime_args("bf16") == ["--sglang-dtype", "bfloat16"]
    with pytest.raises(PrecisionConfigError, match="float16 \\(--fp16\\) or bfloat16"):
        slime_args("float32")


def test_check_slime_args(checkpoint):
    path = checkpoint(LLAMA)
    ok = check_slime_args(["--hf-checkpoint", path, "--fp16", "--sglang-dtype", "bfloat16"], STRICT)
    assert [f.status for f in ok] == ["ok"]
    with pytest.raises(PrecisionMismatchError) as err:
        check_slime_args(["--hf-checkpoint", path, "--sglang-rl-on-policy-target", "fsdp"], STRICT)
    text = str(err.value)
    assert "Megatron learner trains in bfloat16" in text and "runs bfloat16 (dtype=auto" in text
    assert "rl-on-policy-target fsdp" in text
    bf16 = check_slime_args(["--hf-checkpoint", path, *slime_args("bf16")], "bfloat16")
    assert [f.status for f in bf16] == ["ok"]
    with pytest.raises(PrecisionConfigError, match=r"check_slime_args\(\): argument 'argv'"):
        check_slime_args("--fp16")


def test_slime_config_groups_override_last(checkpoint, tmp_path):
    path = checkpoint(LLAMA)
    config = tmp_path / "sglang.yaml"
    config.write_text(
        "sglang:\n"
        "  - name: actor\n"
        "    server_groups:\n"
        "      - {worker_type: prefill, num_gpus: 2, overrides: {dtype: bfloat16}}\n"
        "      - {worker_type: decode, num_gpus: 2}\n"
        "      - {worker_type: placeholder, num_gpus: 2, overrides: {dtype: bfloat16}}\n"
        "  - name: reward\n"
        "    update_weights: false\n"
        "    server_groups:\n"
        "      - {worker_type: regular, num_gpus: 2, overrides: {dtype: bfloat16}}\n"
    )
    argv = ["--fp16", "--hf-checkpoint", path, "--sglang-config", str(config)]
    found = check_slime_args(argv)
    assert [(f.status, f.message.split(")")[0]) for f in found] == [
        ("error", "each of slime's SGLang engines (model 'actor', prefill group"),
        ("ok", "each of slime's SGLang engines (model 'actor', decode group"),
    ]
    config.write_text("server_groups: []\n")
    with pytest.raises(PrecisionConfigError, match="no 'sglang' list"):
        check_slime_args(argv)


# -- AReaL -----------------------------------------------------------------------------------------
def areal(**sections):
    base = {
        "rollout": {"backend": "sglang:d4"},
        "actor": {"backend": "fsdp:d4", "dtype": "bfloat16", "path": ""},
        "sglang": {"dtype": "bfloat16", "kv_cache_dtype": "auto", "model_path": ""},
    }
    for name, values in sections.items():
        base[name] = values if values is None else {**base.get(name, {}), **values}
    return base


def test_areal_overrides():
    assert areal_overrides("fp16") == ["++actor.dtype=float16", "++sglang.dtype=float16"]


def test_check_areal_config():
    found = check_areal_config(areal(), "bfloat16")
    assert [f.status for f in found] == ["ok"]
    fp16 = areal(actor={"dtype": "fp16"}, sglang={"dtype": "float16"})
    assert [f.status for f in check_areal_config(fp16)] == ["warning", "ok"]  # FSDP: no scaler
    megatron = areal(
        actor={"dtype": "float16", "backend": "megatron:d4"}, sglang={"dtype": "float16"}
    )
    assert [f.status for f in check_areal_config(megatron)] == ["ok"]
    ref = areal(actor={"dtype": "float16", "backend": "megatron:d4"}, ref={"dtype": "bfloat16"})
    with pytest.raises(PrecisionMismatchError) as err:
        check_areal_config(ref, STRICT)
    assert "ref trains in bfloat16" in str(err.value) and "runs bfloat16" in str(err.value)
    vllm = areal(rollout={"backend": "vllm:d4"}, actor={"dtype": "float16", "backend": "megatron"})
    assert check_areal_config(vllm) == []  # not an SGLang rollout: its sglang section is unused
    legacy = {**areal(), "rollout": {}, "allocation_mode": "sglang:d4+fsdp:d4"}
    assert [f.status for f in check_areal_config(legacy, "bfloat16")] == ["ok"]


# -- verl's SGLang rollout -----------------------------------------------------------------------
def test_verl_overrides_for_sglang():
    lines = overrides("float16", verl_version="0.9.1", rollout="sglang")
    assert "++actor_rollout_ref.rollout.engine_kwargs.sglang.dtype=float16" in lines
    assert not any("vllm" in line for line in lines)
    assert lines == [
        *overrides("float16", verl_version="0.9.1", vllm_version=None, gpu_capability=None)[:-1],
        "++actor_rollout_ref.rollout.engine_kwargs.sglang.dtype=float16",
        "++ray_kwargs.ray_init.runtime_env.env_vars.PRECISION_PLUGIN=float16",
    ]
    with pytest.raises(PrecisionConfigError, match="'vllm', 'sglang'"):
        overrides(rollout="trtllm")


def verl_cfg(**sglang):
    return {
        "actor_rollout_ref": {
            "rollout": {
                "name": "sglang",
                "dtype": "float16",
                "calculate_log_probs": True,
                "engine_kwargs": {"sglang": sglang, "vllm": {}},
            }
        }
    }


def test_verl_check_config_reads_sglang_engine_kwargs():
    assert check_config(verl_cfg(), STRICT) == []
    assert rollout_dtype_key(verl_cfg()) == "actor_rollout_ref.rollout.dtype"
    key = "actor_rollout_ref.rollout.engine_kwargs.sglang.dtype"
    assert rollout_dtype_key(verl_cfg(dtype="bfloat16")) == key
    assert [p.key for p in check_config(verl_cfg(dtype="bfloat16"))] == [key]
    problems = check_config(verl_cfg(rl_on_policy_target="fsdp", kv_cache_dtype="fp8_e4m3"))
    assert [p.key for p in problems] == ["actor_rollout_ref.rollout.engine_kwargs.sglang"]
    vllm = verl_cfg(dtype="bfloat16")
    vllm["actor_rollout_ref"]["rollout"]["name"] = "vllm"
    assert check_config(vllm) == []  # a vLLM rollout ignores engine_kwargs.sglang


# -- doctor ----------------------------------------------------------------------------------------
def test_doctor(monkeypatch):
    from packaging.version import Version

    from precision_plugin._base import versions

    monkeypatch.setattr(versions, "package_info", lambda name: None)
    assert doctor_findings(PrecisionPolicy(), {}) == []
    info = versions.PackageInfo("sglang", "sglang", Version("0.5.23"))
    monkeypatch.setattr(versions, "package_info", lambda name: info if name == "sglang" else None)
    monkeypatch.setattr(versions, "entry_point_registered", lambda group, name="x": True)

    def found(env):
        return [(f.status, f.message[:40]) for f in doctor_findings(PrecisionPolicy(), env)]

    assert found({})[0] == ("info", "SGLang 0.5.23 installed (distribution 's")
    assert found({})[1][1].startswith("PRECISION_PLUGIN is not set here")
    assert found({"PRECISION_PLUGIN": "1"})[1][0] == "ok"
    assert found({"SGLANG_PLUGINS": "other"})[1] == (
        "warning",
        "SGLANG_PLUGINS=other does not name preci",
    )
    trap = found({"PRECISION_PLUGIN": "1", "SGLANG_SANITIZE_NAN_LOGITS": "1"})
    assert trap[2][0] == "error" and len(trap) == 3
    monkeypatch.setattr(versions, "entry_point_registered", lambda group, name="x": False)
    assert found({})[1][0] == "warning"


@pytest.mark.parametrize(("version", "loads"), [("0.5.10.post1", False), ("0.5.11", True)])
def test_doctor_says_when_sglang_has_no_plugin_loader(monkeypatch, version, loads):
    """SGLang's sglang.srt.plugins loader is absent from the 0.5.10.post1 wheel (AReaL 1.0.4's
    pin) and present from 0.5.11: below it PRECISION_PLUGIN does nothing in SGLang."""
    from packaging.version import Version

    from precision_plugin._base import versions

    info = versions.PackageInfo("sglang", "sglang", Version(version))
    monkeypatch.setattr(versions, "package_info", lambda name: info if name == "sglang" else None)
    monkeypatch.setattr(versions, "entry_point_registered", lambda group, name="x": True)
    second = doctor_findings(PrecisionPolicy(), {"PRECISION_PLUGIN": "float16"})[1]
    if loads:
        assert second.status == "ok"
        return
    assert second.status == "warning"
    assert second.message == (
        "SGLang 0.5.10.post1 has no plugin loader (SGLang loads the sglang.srt.plugins entry "
        "points from 0.5.11; AReaL 1.0.4 pins 0.5.10.post1), so its processes neither set nor "
        "verify the dtype whatever PRECISION_PLUGIN says: the dtype is only what the launch passes"
    )
    assert second.fix.startswith("pass --dtype float16 explicitly")


def test_the_serve_recipe_leaves_the_dtype_to_the_entry_point():
    import shlex
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "integrations" / "sglang" / "serve.sh"
    text = script.read_text()
    assert 'export PRECISION_PLUGIN="${PRECISION_PLUGIN:-float16}"' in text
    line = next(ln for ln in text.replace("\\\n", " ").splitlines() if "exec sglang serve" in ln)
    values = read_server_args(shlex.split(line)[3:])
    assert (values["model_path"], values["dtype"], values["kv_cache_dtype"]) == (
        "$MODEL",
        "auto",  # the entry point makes it the policy dtype
        "auto",
    )


def test_keyword_arguments_that_contain_themselves_are_refused_naming_args():
    from precision_plugin.sglang import check_server_args, read_server_args

    args: dict = {"model_path": "m", "dtype": "float16"}
    args["extra"] = {"loop": args}
    for call in (read_server_args, check_server_args):
        with pytest.raises(PrecisionConfigError, match=r"keyword arguments \(args\).*itself"):
            call(args)
