"""The vLLM adapter without vLLM: engine settings, checkpoint checks, server verification,
doctor findings and the probe engine's request construction (main environment, no vLLM)."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from types import SimpleNamespace

import pytest
import torch

import precision_plugin as pp
from precision_plugin import vllm
from precision_plugin._base import versions
from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm import adapter
from precision_plugin.vllm.models import check_model_config
from precision_plugin.vllm.probe_engine import llm_kwargs, sampled_logprobs, sampling_kwargs
from precision_plugin.vllm.server import verify_engine, verify_server
from tests.loopback import Answer, loopback

A100, H100 = (8, 0), (9, 0)
STRICT = PrecisionPolicy(strictness="error")
# EngineArgs field defaults of three vLLM generations (the flag's default tells them apart).
FIELDS_0_10 = {
    "model": None,
    "dtype": "auto",
    "kv_cache_dtype": "auto",
    "disable_cascade_attn": False,
}
FIELDS_0_18 = {**FIELDS_0_10, "disable_cascade_attn": True, "logprobs_mode": "raw_logprobs"}
FIELDS_0_33 = {**FIELDS_0_18, "disable_cascade_attn": None}
FIELDS_0_8_1 = {"model": None, "dtype": "auto", "kv_cache_dtype": "auto"}


def kw(kwargs, policy=None, version="0.33.0", capability=A100, fields=None):
    return vllm.engine_kwargs(
        kwargs, policy or PrecisionPolicy(), version=version, capability=capability, fields=fields
    )


# -- dtype ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("asked", [None, "auto", "AUTO"])
def test_auto_dtype_becomes_policy_dtype(asked):
    args = {"model": "m"} if asked is None else {"model": "m", "dtype": asked}
    assert kw(args)["dtype"] == "float16"
    assert kw(args, PrecisionPolicy(dtype="bfloat16"))["dtype"] == "bfloat16"


@pytest.mark.parametrize("asked", ["float16", "half", "fp16", torch.float16])
def test_matching_dtype_is_kept(asked, caplog):
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        assert kw({"dtype": asked})["dtype"] == asked
    assert not caplog.records


def test_input_is_not_modified():
    args = {"model": "m", "dtype": "bfloat16", "disable_cascade_attn": True}
    kw(args)
    assert args == {"model": "m", "dtype": "bfloat16", "disable_cascade_attn": True}


def test_conflicting_dtype_is_coerced_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        assert kw({"dtype": "bfloat16"})["dtype"] == "float16"
    assert "dtype='bfloat16' contradicts the policy dtype float16" in caplog.text


def test_conflicting_dtype_is_refused_when_strict():
    with pytest.raises(PrecisionMismatchError, match=r"bfloat16.*strictness='error'.*Fix"):
        kw({"dtype": "bfloat16"}, STRICT)


def test_enforce_dtype_off_leaves_dtype():
    policy = PrecisionPolicy.from_dict({"vllm": {"enforce_dtype": False}})
    assert "dtype" not in kw({"model": "m"}, policy)
    assert kw({"dtype": "bfloat16"}, policy)["dtype"] == "bfloat16"


def test_defaults_follow_active_policy():
    pp.enable(dtype="bfloat16")
    assert vllm.engine_kwargs({}, version=None)["dtype"] == "bfloat16"


def test_defaults_follow_env(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "bf16")
    assert vllm.engine_kwargs({}, version=None)["dtype"] == "bfloat16"


# -- kv_cache_dtype ------------------------------------------------------------------------------
def test_kv_cache_auto_is_left_alone():
    assert "kv_cache_dtype" not in kw({})
    assert kw({"kv_cache_dtype": "auto"})["kv_cache_dtype"] == "auto"
    assert kw({"kv_cache_dtype": "float16"})["kv_cache_dtype"] == "float16"


def test_kv_cache_must_match_model_dtype(caplog):
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        assert kw({"kv_cache_dtype": "bfloat16"})["kv_cache_dtype"] == "auto"
    assert "must match the model dtype float16" in caplog.text
    with pytest.raises(PrecisionMismatchError, match="kv_cache_dtype"):
        kw({"kv_cache_dtype": "bfloat16"}, STRICT)


def test_fp8_kv_cache_is_kept_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        assert kw({"kv_cache_dtype": "fp8_e4m3"})["kv_cache_dtype"] == "fp8_e4m3"
    assert "fp8_e4m3" in caplog.text
    with pytest.raises(PrecisionMismatchError):
        kw({"kv_cache_dtype": "fp8"}, STRICT)


# -- cascade flag --------------------------------------------------------------------------------
def test_flag_passed_in_buggy_window_on_a100():
    assert kw({}, version="0.10.1", fields=FIELDS_0_10)["disable_cascade_attn"] is True
    assert "disable_cascade_attn" not in kw({}, version="0.10.1", capability=H100)


def test_user_false_in_buggy_window(caplog):
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        out = kw({"disable_cascade_attn": False}, version="0.9.2", fields=FIELDS_0_10)
    assert out["disable_cascade_attn"] is True
    assert "22103" in caplog.text
    with pytest.raises(PrecisionMismatchError, match="disable_cascade_attn=False"):
        kw({"disable_cascade_attn": False}, STRICT, version="0.9.2")


@pytest.mark.parametrize("version", ["0.11.0", "0.17.1", "0.18.0", "0.31.0"])
def test_auto_passes_nothing_once_fixed(version):
    assert "disable_cascade_attn" not in kw({}, version=version, fields=FIELDS_0_18)
    # the user's own choice is respected there
    assert kw({"disable_cascade_attn": False}, version=version)["disable_cascade_attn"] is False


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.40.0"])
@pytest.mark.parametrize("mode", ["auto", "force"])
def test_never_passed_once_deprecated(version, mode):
    policy = PrecisionPolicy.from_dict({"vllm": {"cascade_guard": mode}})
    out = kw({"disable_cascade_attn": True}, policy, version=version, fields=FIELDS_0_33)
    assert "disable_cascade_attn" not in out


def test_never_passed_where_field_is_missing_or_deprecated():
    force = PrecisionPolicy.from_dict({"vllm": {"cascade_guard": "force"}})
    # the version says the flag exists, the installed EngineArgs says otherwise
    assert "disable_cascade_attn" not in kw({}, force, version="0.20.0", fields=FIELDS_0_8_1)
    assert "disable_cascade_attn" not in kw({}, force, version="0.31.0", fields=FIELDS_0_33)
    assert kw({}, force, version="0.31.0", fields=FIELDS_0_18)["disable_cascade_attn"] is True


def test_no_flag_before_0_8_2():
    out = kw({"disable_cascade_attn": True}, version="0.8.1", fields=FIELDS_0_8_1)
    assert "disable_cascade_attn" not in out


def test_guard_off_leaves_the_flag_alone():
    off = PrecisionPolicy.from_dict({"vllm": {"cascade_guard": "off"}})
    assert "disable_cascade_attn" not in kw({}, off, version="0.10.1")
    assert (
        kw({"disable_cascade_attn": False}, off, version="0.10.1")["disable_cascade_attn"] is False
    )


# -- checkpoint checks ---------------------------------------------------------------------------
def _checkpoint(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3", "gemma3_text", "glm4"])
def test_fp16_refusal(tmp_path, model_type):
    path = _checkpoint(tmp_path, model_type=model_type, torch_dtype="bfloat16")
    with pytest.raises(PrecisionConfigError) as err:
        check_model_config(path)
    text = str(err.value)
    assert repr(model_type) in text and "float16" in text and "dtype='bfloat16'" in text
    # consistent bf16 is fine
    assert check_model_config(path, PrecisionPolicy(dtype="bfloat16")) == []


def test_refusal_as_finding(tmp_path):
    path = _checkpoint(tmp_path, model_type="gemma2")
    findings = check_model_config(path, raise_on_refusal=False)
    assert [f.status for f in findings] == ["error"]


@pytest.mark.parametrize(
    "model_type", ["gemma3n", "gemma4", "gpt_oss", "qwen3_5", "qwen3_moe", "glm4_moe"]
)
def test_overflow_risk_warning(model_type):
    findings = check_model_config({"model_type": model_type, "dtype": "float16"})
    assert [f.status for f in findings] == ["warning"]
    assert findings[0].details["evidence"]
    assert check_model_config({"model_type": model_type}, PrecisionPolicy(dtype="bfloat16")) == []


def test_nested_text_config():
    config = {"model_type": "llava", "text_config": {"model_type": "gemma2"}}
    findings = check_model_config(config)
    assert findings[0].status == "warning" and "gemma2" in findings[0].message


def test_cast_is_reported_and_plain_llama_is_fine():
    findings = check_model_config({"model_type": "llama", "torch_dtype": "bfloat16"})
    assert [(f.status, "cast it to float16" in f.message) for f in findings] == [("info", True)]
    assert check_model_config({"model_type": "qwen2", "dtype": "float16"}) == []


def test_missing_config(tmp_path):
    with pytest.raises(PrecisionConfigError, match=r"no config\.json"):
        check_model_config(tmp_path)


# -- server / engine verification ----------------------------------------------------------------
def _server_config(dtype="torch.float16", cascade=None, cache="auto"):
    return {
        "model_config": {"dtype": dtype, "disable_cascade_attn": cascade},
        "cache_config": {"cache_dtype": cache},
    }


def test_verify_server_ok():
    findings = verify_server(_server_config(), PrecisionPolicy())
    assert [f.status for f in findings] == ["ok"]


def test_verify_server_mismatch_warns(caplog):
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        findings = verify_server(_server_config("torch.bfloat16"), PrecisionPolicy())
    assert findings[0].status == "error"
    assert "runs torch.bfloat16, but the learner runs float16" in caplog.text
    assert "PRECISION_PLUGIN=float16" in caplog.text


def test_verify_server_mismatch_strict():
    with pytest.raises(PrecisionMismatchError, match=r"torch.bfloat16.*PRECISION_PLUGIN=float16"):
        verify_server(_server_config("torch.bfloat16"), STRICT)


def test_verify_server_kv_and_cascade():
    policy = PrecisionPolicy()
    findings = verify_server(
        {
            "vllm_config": _server_config(cascade=False, cache="bfloat16"),
            "system_env": {"vllm_version": "0.10.1"},
        },
        policy,
    )
    assert [f.status for f in findings] == ["ok", "warning", "warning"]
    assert "cascade attention enabled" in findings[2].message
    # 0.33: the flag is a no-op; nothing to report
    findings = verify_server(
        {"vllm_config": _server_config(cascade=True), "system_env": {"vllm_version": "0.33.0"}},
        policy,
    )
    assert [f.status for f in findings] == ["ok"]


@pytest.fixture
def server():
    with loopback(Answer("/server_info?config_format=json")) as answer:
        yield answer


def test_verify_server_over_http(server):
    payload = {
        "vllm_config": _server_config("torch.bfloat16"),
        "vllm_env": {},
        "system_env": {"vllm_version": "0.33.0"},
    }
    server.set(json.dumps(payload).encode())
    url = server.url
    with pytest.raises(PrecisionMismatchError, match=f"vLLM server at {url} runs torch.bfloat16"):
        verify_server(url, STRICT)
    assert verify_server(url, PrecisionPolicy(dtype="bfloat16"))[0].status == "ok"


def test_verify_server_without_dev_mode(server):
    url = f"{server.url}/nope"
    with pytest.raises(PrecisionConfigError, match="VLLM_SERVER_DEV_MODE=1"):
        verify_server(url)


def test_verify_server_unreachable_is_a_warning():
    findings = verify_server("http://127.0.0.1:9")  # discard port: connection refused
    assert findings[0].status == "warning" and "Could not ask" in findings[0].message
    # The hint asks whether a server runs there (not about VLLM_SERVER_DEV_MODE), with vLLM's
    # own default port in the example.
    assert "Is a vLLM server running at http://127.0.0.1:9? Start it first" in findings[0].message
    assert "e.g. http://localhost:8000)" in findings[0].message
    assert findings[0].fix == "start the server, or fix its URL"


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ("localhost:8000", "no http:// or https:// scheme"),
        ("http://h:abc", "Port could not be cast to integer value as 'abc'"),
        ("http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://", "no host"),
    ],
)
def test_verify_server_refuses_what_is_no_url_before_asking(server, problem):
    """One URL check for the vLLM and SGLang servers: a malformed URL is the caller's error,
    not a finding that suggests VLLM_SERVER_DEV_MODE."""
    from precision_plugin.sglang import verify_server as sglang_verify_server

    with pytest.raises(PrecisionConfigError) as info:
        verify_server(server)
    assert str(info.value) == (
        f"verify_server(): argument 'server' got {server!r}, which is not a server URL "
        f"({problem}); pass the vLLM server's base URL such as 'http://localhost:8000', or its "
        f"/server_info JSON, or a TRL VLLMClient."
    )
    with pytest.raises(PrecisionConfigError, match=r"'http://localhost:30000', or its /server"):
        sglang_verify_server(server)


def test_verify_server_refuses_json_that_is_no_server_info():
    with pytest.raises(PrecisionConfigError, match=r"has no 'vllm_config' or 'model_config' key"):
        verify_server({"dtype": "float16"})


def test_verify_engine_reads_model_config():
    engine = SimpleNamespace(
        llm_engine=SimpleNamespace(
            vllm_config=SimpleNamespace(
                model_config=SimpleNamespace(dtype=torch.bfloat16, disable_cascade_attn=True),
                cache_config=SimpleNamespace(cache_dtype="auto"),
            )
        )
    )
    with pytest.raises(PrecisionMismatchError, match=r"colocated vLLM engine runs torch\.bfloat16"):
        verify_engine(engine, STRICT)
    assert verify_engine(engine, PrecisionPolicy(dtype="bfloat16"))[0].status == "ok"


def test_train_begin_hook_verifies_server_mode(server):
    server.set(json.dumps({"vllm_config": _server_config("torch.bfloat16")}).encode())
    url = server.url

    class Client:  # TRL's VLLMClient.get_server_info() returns response.json()["vllm_config"]
        base_url = url

        def get_server_info(self):
            from precision_plugin.vllm.server import fetch_server_info

            return fetch_server_info(url)["vllm_config"]

    args = SimpleNamespace(use_vllm=True, vllm_mode="server")
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(mode="server", vllm_client=Client()))
    with pytest.raises(PrecisionMismatchError, match=r"runs torch\.bfloat16"):
        adapter.precision_train_begin(policy=STRICT, args=args, trainer=trainer)
    # verify_server=False skips it; no vLLM in use does nothing
    quiet = STRICT.replace(vllm={"verify_server": False})
    adapter.precision_train_begin(policy=quiet, args=args, trainer=trainer)
    adapter.precision_train_begin(
        policy=STRICT, args=SimpleNamespace(use_vllm=False), trainer=trainer
    )


# -- hooks without vLLM --------------------------------------------------------------------------
def test_no_vllm_means_no_patch_and_no_findings(monkeypatch):
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    pp.enable()
    from precision_plugin._core.manager import active_patches

    assert "vllm" not in active_patches()
    assert adapter.precision_doctor(policy=PrecisionPolicy()) == []
    vllm.general_plugin()  # without vLLM and without the env var: nothing, no error


def test_doctor_with_a_vllm_outside_trl_range(monkeypatch):
    real = versions.package_info

    def fake(name):
        if name == "vllm":
            return versions.PackageInfo("vllm", "vllm", versions.parse_version("0.10.1"))
        return real(name)

    monkeypatch.setattr(versions, "package_info", fake)
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    findings = adapter.precision_doctor(policy=PrecisionPolicy())
    text = "\n".join(f"{f.status}: {f.message}" for f in findings)
    assert "info: vLLM 0.10.1 installed (distribution 'vllm')" in text
    assert "warning: TRL 1.16.0 supports vLLM <=0.31.0,>=0.22.0" in text
    assert "change: cascade-attention guard (auto, vLLM 0.10.1" in text
    assert "change: enable() sets dtype=float16" in text
    assert "VLLM_PLUGINS='lora_filesystem_resolver' does not name precision_plugin" in text


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "precision_plugin"]
    assert ep.value == "precision_plugin.vllm:general_plugin"
    assert ep.load() is vllm.general_plugin


# -- probe engine requests -----------------------------------------------------------------------
def test_probe_llm_kwargs():
    out = llm_kwargs("/m", "float16", 3, FIELDS_0_18, tokenizer=False)
    assert out["dtype"] == "float16" and out["seed"] == 3
    assert out["logprobs_mode"] == "raw_logprobs"
    assert out["skip_tokenizer_init"] is True
    old = llm_kwargs("/m", "bfloat16", 0, FIELDS_0_8_1)
    assert "logprobs_mode" not in old and old["dtype"] == "bfloat16"


def test_probe_sampling_kwargs():
    out = sampling_kwargs(32, 7)
    assert out["temperature"] == 1.0 and out["top_p"] == 1.0 and out["n"] == 1
    assert out["logprobs"] == 0 and out["max_tokens"] == 32 and out["seed"] == 7
    assert "top_k" not in out  # vLLM's default is "no top-k" in every version
    assert sampling_kwargs(8, 0, detokenize=False)["detokenize"] is False


def test_sampled_logprobs_nan_when_missing():
    entry = SimpleNamespace(logprob=-1.5)
    got = sampled_logprobs([5, 6, 7], [{5: entry}, {9: entry}, None])
    assert got[0] == -1.5 and math.isnan(got[1]) and math.isnan(got[2])
    assert all(math.isnan(x) for x in sampled_logprobs([1, 2], None))


def test_probe_engine_refuses_without_vllm():
    from precision_plugin.vllm.probe_engine import VLLMRolloutEngine

    factory = adapter.precision_probe_engines()["vllm"]
    assert factory is VLLMRolloutEngine
    with pytest.raises(PrecisionConfigError, match="vLLM is not installed"):
        factory("/m", "float16", "cuda", 0)


def test_probe_refuses_a_missing_vllm_before_loading_the_model(monkeypatch):
    """`probe --engine vllm` without vLLM: one message before the model loads (it loaded the
    model and ran the headroom pass, 39 s on SmolLM2, before saying so)."""
    import precision_plugin.probe.run as probe_run
    from precision_plugin.probe import ProbeConfig, run_probe

    def never(*_: object) -> None:
        raise AssertionError("the model was loaded before the engine was checked")

    monkeypatch.setattr(probe_run, "_load_trainer", never)
    with pytest.raises(PrecisionConfigError, match="vLLM is not installed"):
        run_probe(ProbeConfig(engine="vllm", device="cpu"))
    with pytest.raises(PrecisionConfigError, match="vLLM is not installed"):
        adapter.precision_probe_engines()["vllm"].preflight("cuda")


def test_the_cli_refuses_a_missing_vllm_with_the_arguments(monkeypatch, tmp_path, capsys):
    """Issue 54, item 7: refused as the arguments are handled, before the output paths, the
    prompts file or the model: a usage error (exit 2), one line."""
    import precision_plugin.cli.probe as cli_probe
    import precision_plugin.probe.run as probe_run
    from precision_plugin.cli import main

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")

    def never(*_: object, **__: object) -> None:
        raise AssertionError("the engine was checked after work began")

    monkeypatch.setattr(probe_run, "run_probe", never)
    monkeypatch.setattr(cli_probe, "check_outputs", never)
    missing = tmp_path / "no-such-prompts.txt"
    code = main(["probe", "--engine", "vllm", "--prompts", str(missing), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("precision-plugin: error: probe --engine vllm: vLLM is not installed")
    assert len(err.strip().splitlines()) == 1
