"""The plugin against real OpenRLHF (0.11.2, and 0.11.0 beside it) with real vLLM 0.29.0 and Ray.

Covered: OpenRLHF's own argument parsing; its engine-creation path (``create_vllm_engines`` ->
``RolloutRayActor.__init__`` -> vLLM's ``AsyncEngineArgs`` and ``create_engine_config``) up to
engine construction; a local Ray cluster on loopback, where ``PRECISION_PLUGIN`` reaches the
engine actors (inherited from the driver, or through ``runtime_env()``) and the engine built
there runs the policy dtype and says so in the actor's log. Stubs: see ``stubs.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import shlex
import socket
import textwrap
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from conftest import OLD, ROOT, TrainRun, base_argv, run_old
from packaging.version import Version

import precision_plugin as pp
from precision_plugin import openrlhf as orl
from precision_plugin._core.metrics.mismatch import ALIASES, compute_mismatch
from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.openrlhf.installed import (
    RELEASED_WEIGHT_SYNC,
    engine_dtype,
    parser_flags,
    weight_sync,
)
from precision_plugin.openrlhf.layout import DEEPSPEED_FP16_SCALER, WORKER_EXTENSION, layout
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm.doctor import declared_vllm_range

STRICT = PrecisionPolicy(strictness="error")


def errors(findings):
    return [f for f in findings if f.status == "error"]


# -- the installed packages -------------------------------------------------------------------
def test_installed_openrlhf_and_what_it_hard_codes():
    found = orl.installed()
    assert found.version == Version("0.11.2")
    assert found.engine_dtype == "bfloat16"
    assert found.weight_sync == RELEASED_WEIGHT_SYNC  # asserts, no cast
    assert {"--ds.param_dtype", "--algo.advantage.is_correction_level"} <= found.flags
    assert "--algo.advantage.is_correction_enable" not in found.flags
    assert "--" + layout(found.version).is_switch in found.flags
    # vLLM: the version OpenRLHF pins
    from precision_plugin.vllm import vllm_version

    assert vllm_version().version == Version("0.29.0") in declared_vllm_range("openrlhf")


def test_openrlhf_0110_beside_it_has_the_other_importance_sampling_flags():
    root = OLD / "openrlhf"
    flags = parser_flags((root / "cli" / "train_ppo_ray.py").read_text())
    assert "--algo.advantage.is_correction_enable" in flags
    assert "--algo.advantage.is_correction_level" not in flags
    assert "--ds.param_dtype" in flags
    assert "--" + layout("0.11.0").is_switch in flags
    assert engine_dtype((root / "trainer" / "ray" / "vllm_engine.py").read_text()) == "bfloat16"
    sync = weight_sync(
        (root / "trainer" / "ray" / "vllm_worker_wrap.py").read_text(),
        (root / "trainer" / "ray" / "ppo_actor.py").read_text(),
    )
    assert sync == RELEASED_WEIGHT_SYNC


def test_a_cast_in_the_weight_sync_would_be_seen(tmp_path):
    """OpenRLHF#1348 (open) casts the synced params to bf16 in broadcast_to_vllm."""
    actor = (Path(orl.installed().path) / "trainer" / "ray" / "ppo_actor.py").read_text()
    worker = (Path(orl.installed().path) / "trainer" / "ray" / "vllm_worker_wrap.py").read_text()
    patched = actor.replace(
        "def _broadcast_param(param, count, num_params):",
        "def _broadcast_param(param, count, num_params):\n"
        "            param = param.data.to(torch.bfloat16)",
        1,
    )
    assert patched != actor
    assert weight_sync(worker, patched).casts_to == "bfloat16"


# -- OpenRLHF's real argument parsing ---------------------------------------------------------
def test_args_parse_with_openrlhfs_parser_and_check_clean(llama_dir, monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    parsed = orl.parse_args([*base_argv(llama_dir), *orl.args()])
    assert parsed.ds.param_dtype == "fp16"
    findings = orl.check_args(parsed, STRICT)  # nothing raised
    assert not errors(findings)
    assert any("hard-coded dtype='bfloat16' with float16" in f.message for f in findings)


def test_without_the_variable_the_check_says_exactly_what_to_add(llama_dir, monkeypatch):
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    parsed = orl.parse_args([*base_argv(llama_dir), "--ds.param_dtype", "fp16"])
    with pytest.raises(PrecisionMismatchError) as err:
        orl.check_args(parsed, STRICT)
    text = str(err.value)
    assert "in 1 place(s)" in text
    assert "sample in bfloat16 (create_vllm_engines hard-codes dtype='bfloat16')" in text
    assert "mismatch dtype: src torch.float16, dst torch.bfloat16" in text
    # the strict policy travels as quoted JSON, exactly what runtime_env() carries
    wanted = orl.runtime_env(STRICT)
    assert f"export PRECISION_PLUGIN={shlex.quote(wanted['env_vars']['PRECISION_PLUGIN'])} " in text
    assert json.dumps(wanted, separators=(",", ":")) in text


def test_the_bf16_default_and_the_bf16_only_features_are_named_together(llama_dir, monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    argv = [*base_argv(llama_dir), "--ds.tensor_parallel_size", "2", "--ds.load_in_4bit"]
    parsed = orl.parse_args(argv)
    assert parsed.ds.param_dtype == "bf16"  # OpenRLHF's default
    with pytest.raises(PrecisionMismatchError, match=r"in 3 place\(s\)") as err:
        orl.check_args(parsed, STRICT)
    for fix in ("--ds.param_dtype fp16", "--ds.tensor_parallel_size 1", "drop --ds.load_in_4bit"):
        assert fix in str(err.value)


def test_openrlhf_itself_refuses_autotp_and_4bit_in_fp16(llama_dir):
    """What the check predicts, from OpenRLHF's own code."""
    from openrlhf.models.actor import Actor
    from openrlhf.utils import get_strategy

    parsed = orl.parse_args([*base_argv(llama_dir), *orl.args(), "--ds.tensor_parallel_size", "2"])
    with pytest.raises(AssertionError, match="BF16 is required for tensor parallel training"):
        get_strategy(parsed)
    with pytest.raises(AssertionError, match="bnb_4bit_compute_dtype = bf16"):
        Actor(llama_dir, attn_implementation="eager", param_dtype="fp16", load_in_4bit=True)


def test_importance_sampling_flags_follow_the_version(llama_dir):
    on = orl.parse_args([*base_argv(llama_dir), *layout("0.11.2").is_on_flags()])
    assert on.algo.advantage.is_correction_level == "token"
    assert not [f for f in orl.find_problems(on, pp.PrecisionPolicy()) if f.status == "warning"]
    off = orl.parse_args(base_argv(llama_dir))
    (warning,) = [f for f in orl.find_problems(off, pp.PrecisionPolicy()) if f.status == "warning"]
    assert "--algo.advantage.is_correction_level token" in warning.fix
    with pytest.raises(PrecisionConfigError, match="unrecognized arguments"):
        orl.parse_args([*base_argv(llama_dir), "--algo.advantage.is_correction_enable"])
    # the other generation's flag in a dict is named
    old_style = {"ds.param_dtype": "fp16", "algo.advantage.is_correction_enable": True}
    (problem,) = errors(orl.find_problems(old_style, pp.PrecisionPolicy()))
    assert "spells the importance-sampling switch --algo.advantage.is_correction_level" in (
        problem.message
    )


def test_openrlhf_0110_parses_its_own_flags_and_checks_the_same(llama_dir):
    code = textwrap.dedent(
        f"""
        import openrlhf, json
        from precision_plugin import openrlhf as orl
        from precision_plugin.policy import PrecisionPolicy
        print("FILE", openrlhf.__file__)
        argv = {base_argv(llama_dir)!r} + orl.args(openrlhf_version="0.11.0")
        parsed = orl.parse_args(argv + {layout("0.11.0").is_on_flags()!r})
        print("DTYPE", parsed.ds.param_dtype, parsed.algo.advantage.is_correction_enable)
        found = orl.find_problems(parsed, PrecisionPolicy(), openrlhf_version="0.11.0",
                                  environ={{}})
        print("ERRORS", json.dumps([f.message for f in found if f.status == "error"]))
        print("WARNINGS", json.dumps([f.message for f in found if f.status == "warning"]))
        try:
            orl.parse_args(argv + ["--algo.advantage.is_correction_level", "token"])
        except Exception as exc:
            print("REFUSED", type(exc).__name__, str(exc))
        """
    )
    out = run_old(code)
    assert out["DTYPE"] == "fp16 True"
    (engines,) = json.loads(out["ERRORS"])  # the engines only: PRECISION_PLUGIN is not set
    assert "sample in bfloat16" in engines
    assert json.loads(out["WARNINGS"]) == []  # vllm_kl is logged: the correction is on
    assert out["REFUSED"].startswith("PrecisionConfigError")
    assert "unrecognized arguments: --algo.advantage.is_correction_level" in out["REFUSED"]


# -- the engine-creation path up to engine construction, in this process ----------------------
def actor_kwargs(model: str, logprobs_mode: str | None = None) -> dict:
    """The kwargs OpenRLHF's real create_vllm_engines gives RolloutRayActor (Ray's placement
    group and the actor launch intercepted; everything else runs)."""
    from openrlhf.trainer.ray import vllm_engine

    captured = {}

    class Launch:
        def remote(self, **kwargs):
            captured.update(kwargs)
            return "engine"

    with (
        mock.patch.object(vllm_engine, "placement_group"),
        mock.patch.object(vllm_engine, "PlacementGroupSchedulingStrategy"),
        mock.patch.object(vllm_engine.ray, "get"),
        mock.patch.object(vllm_engine.RolloutRayActor, "options", return_value=Launch()),
    ):
        vllm_engine.create_vllm_engines(
            1, 1, model, 42, False, False, False, 256, None, 0.9, False, logprobs_mode
        )
    return captured


def build_engine(kwargs: dict, tmp_path: Path, monkeypatch) -> dict:
    """Run RolloutRayActor.__init__ (OpenRLHF's real code, without Ray) on ``kwargs``."""
    import stubs
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    monkeypatch.setenv("PP_TEST_CAPTURE", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # the actor reads it from its Ray worker
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")  # the actor sets it to 1
    from vllm.v1.engine.async_llm import AsyncLLM

    for name in ("__init__", "is_sleeping", "__del__"):
        monkeypatch.setattr(AsyncLLM, name, vars(AsyncLLM)[name])  # restored after the test
    stubs.stop_at_engine()
    actor_class = RolloutRayActor.__ray_metadata__.modified_class
    actor = actor_class.__new__(actor_class)
    asyncio.run(actor_class.__init__(actor, **kwargs))
    (path,) = tmp_path.glob("engine-*.json")
    return json.loads(path.read_text())


def test_openrlhf_hard_codes_bf16_and_the_engine_runs_it_without_the_plugin(
    llama_dir, tmp_path, monkeypatch
):
    kwargs = actor_kwargs(llama_dir)
    assert kwargs["dtype"] == "bfloat16"
    assert kwargs["worker_extension_cls"] == WORKER_EXTENSION
    assert build_engine(kwargs, tmp_path, monkeypatch)["dtype"] == "torch.bfloat16"


def test_with_the_plugin_the_engine_runs_the_policy_even_strict(
    llama_dir, tmp_path, monkeypatch, caplog
):
    kwargs = actor_kwargs(llama_dir, logprobs_mode="processed_logprobs")
    pp.enable(strictness="error")  # OpenRLHF's hard-coded bf16 is no request of the user
    try:
        with caplog.at_level("WARNING", logger="precision_plugin"):
            record = build_engine(kwargs, tmp_path, monkeypatch)
    finally:
        pp.disable()
    assert record["dtype"] == "torch.float16"
    assert record["worker_extension_cls"] == WORKER_EXTENSION
    assert "OpenRLHF hard-codes dtype='bfloat16' for its vLLM engines" in caplog.text
    assert "runs float16, the precision policy's dtype" in caplog.text
    # a user's own contradicting dtype is still refused under strict mode
    from vllm.engine.arg_utils import EngineArgs

    pp.enable(strictness="error")
    try:
        with pytest.raises(PrecisionMismatchError, match="dtype='bfloat16'"):
            EngineArgs(model=llama_dir, dtype="bfloat16").create_model_config()
    finally:
        pp.disable()


def test_weight_sync_assert_fires_exactly_as_the_check_says():
    """OpenRLHF's real WorkerWrap.update_weight on a one-process gloo group: a float16 learner
    against a bf16 engine fails with the message check_args quotes; against an fp16 engine the
    dtype check passes (the next step needs CUDA)."""
    import torch.distributed as dist
    from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        engine = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
        with pytest.raises(
            AssertionError, match=r"mismatch dtype: src torch\.float16, dst torch\.bfloat16"
        ):
            WorkerWrap.update_weight(engine, "w", torch.float16, (2,))
        engine.model_config.dtype = torch.float16
        with pytest.raises(Exception) as past:
            WorkerWrap.update_weight(engine, "w", torch.float16, (2,))
        assert "mismatch dtype" not in str(past.value)  # it got past the dtype assert
    finally:
        dist.destroy_process_group()


# -- a real local Ray cluster on loopback ------------------------------------------------------
@pytest.mark.multiprocess
def test_exported_variable_reaches_the_engine_actor_through_openrlhfs_own_ray_init(
    llama_dir, monkeypatch
):
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    run = TrainRun([*base_argv(llama_dir), *orl.args()])
    (engine,) = run.run()
    # OpenRLHF's ray.init passed its three variables only: the actor inherited the export
    (passed,) = run.init_calls
    assert "PRECISION_PLUGIN" not in passed["env_vars"]
    assert engine["precision_plugin_env"] == "float16"
    assert engine["dtype"] == "torch.float16"
    assert engine["worker_extension_cls"] == WORKER_EXTENSION
    assert any("OpenRLHF hard-codes dtype='bfloat16'" in line for line in engine["log"])
    assert any("runs float16, the precision policy's dtype" in line for line in engine["log"])


@pytest.mark.multiprocess
def test_runtime_env_reaches_the_engine_actor_when_the_driver_starts_ray(llama_dir, monkeypatch):
    import ray

    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    env = orl.runtime_env("float16")
    run = TrainRun([*base_argv(llama_dir), *orl.args("float16")])
    (engine,) = run.run(before=lambda: ray.init(runtime_env=env))
    assert run.init_calls == [env]  # OpenRLHF saw Ray up and skipped its own ray.init
    assert engine["precision_plugin_env"] == "float16"
    assert engine["dtype"] == "torch.float16"
    assert any("runs float16" in line for line in engine["log"])


@pytest.mark.multiprocess
def test_without_the_variable_the_engine_actor_runs_openrlhfs_bf16(llama_dir, monkeypatch):
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    run = TrainRun([*base_argv(llama_dir), *orl.args()])
    (engine,) = run.run()
    assert engine["precision_plugin_env"] is None
    assert engine["dtype"] == "torch.bfloat16"
    assert engine["log"] == []


# -- DeepSpeed and the mismatch metric -------------------------------------------------------
def test_openrlhfs_fp16_deepspeed_section_runs_deepspeeds_default_scaler():
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config
    from openrlhf.utils.deepspeed.deepspeed_utils import get_train_ds_config

    cfg = get_train_ds_config(offload=False, param_dtype="fp16")
    assert cfg["fp16"] == {"enabled": True} and cfg["bf16"] == {"enabled": False}
    ds = DeepSpeedFP16Config(**cfg["fp16"])
    assert ds.loss_scale == 0  # dynamic
    runs = {
        "enabled": ds.enabled,
        "init_scale": 2.0**ds.initial_scale_power,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": ds.loss_scale_window,
        "hysteresis": ds.hysteresis,
        "min_scale": float(ds.min_loss_scale),
    }
    assert runs == DEEPSPEED_FP16_SCALER


def _batch():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 7, dtype=torch.float64)
    mask[1, 5:] = mask[2, 2:] = 0
    old = torch.log(0.05 + 0.9 * torch.rand(3, 7, generator=g, dtype=torch.float64))
    rollout = (old + 0.03 * torch.randn(3, 7, generator=g, dtype=torch.float64)).clamp(max=0)
    return old, rollout, mask


def logged_name(key: str) -> str:
    """The name OpenRLHF's own loggers (wandb and TensorBoard, real methods) give the training
    metric ``key`` that its PPO actor records (``experience.info[key]``)."""
    from openrlhf.utils.logging_utils import TensorboardLogger, WandbLogger

    actor = (Path(orl.installed().path) / "trainer" / "ray" / "ppo_actor.py").read_text()
    assert f'experience.info["{key}"]' in actor
    wandb, board = [], []
    WandbLogger.log_train(SimpleNamespace(handle=SimpleNamespace(log=wandb.append)), 3, {key: 0.5})
    writer = SimpleNamespace(add_scalar=lambda *a: board.append(a))
    TensorboardLogger.log_train(SimpleNamespace(writer=writer), 3, {key: 0.5})
    (name,) = [n for n in wandb[0] if n != "train/global_step"]
    assert board == [(name, 0.5, 3)]
    return name


def test_vllm_kl_is_our_k1_kl_in_openrlhfs_own_loss():
    from openrlhf.models.loss import PolicyLoss

    (alias,) = [a for a in ALIASES["k1_kl"] if a.system == "OpenRLHF"]
    assert alias.name == logged_name("vllm_kl")
    old, rollout, mask = _batch()
    adv = torch.ones_like(old)
    on = PolicyLoss(is_correction_level="token")
    *_, vllm_kl, _ = on(old, old, adv, action_mask=mask, rollout_log_probs=rollout)
    ours = compute_mismatch(old, rollout, mask).k1_kl
    assert math.isclose(vllm_kl.item(), ours, rel_tol=1e-12)
    *_, none, _ = PolicyLoss()(old, old, adv, action_mask=mask, rollout_log_probs=rollout)
    assert none is None  # logged only with the correction on


def test_vllm_kl_in_openrlhf_0110():
    old, rollout, mask = _batch()
    code = textwrap.dedent(
        f"""
        import torch, openrlhf
        from openrlhf.models.loss import PolicyLoss
        print("FILE", openrlhf.__file__)
        old = torch.tensor({old.tolist()!r}, dtype=torch.float64)
        rollout = torch.tensor({rollout.tolist()!r}, dtype=torch.float64)
        mask = torch.tensor({mask.tolist()!r}, dtype=torch.float64)
        loss = PolicyLoss(enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 5.0])
        out = loss(old, old, torch.ones_like(old), action_mask=mask, rollout_log_probs=rollout)
        print("KL", repr(out[-1].item()))
        """
    )
    theirs = float(run_old(code)["KL"])
    assert math.isclose(theirs, compute_mismatch(old, rollout, mask).k1_kl, rel_tol=1e-12)


# -- command line and doctor ----------------------------------------------------------------
def test_cli_checks_a_command_line_with_openrlhfs_parser(llama_dir, monkeypatch, capsys):
    from precision_plugin.cli import main

    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    argv = [*base_argv(llama_dir), "--ds.param_dtype", "fp16"]
    assert main(["openrlhf-args", "--check", "--", *argv]) == 1
    out = capsys.readouterr().out
    assert "error: OpenRLHF's vLLM engines sample in bfloat16" in out
    assert "  fix: export PRECISION_PLUGIN=float16" in out
    monkeypatch.setenv("PRECISION_PLUGIN", "float16")
    assert main(["openrlhf-args", "--check", "--", *argv]) == 0
    assert "0 contradiction(s) with the float16 policy" in capsys.readouterr().out


def test_doctor_sees_openrlhf(monkeypatch):
    from precision_plugin.openrlhf.doctor import doctor_findings

    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    findings = doctor_findings(PrecisionPolicy())
    assert findings[0].details["version"] == "0.11.2"
    (engines,) = [f for f in findings if "hard-codes dtype='bfloat16'" in f.message]
    assert (
        engines.status == "change"
        and engines.fix == "export PRECISION_PLUGIN=float16 before the run"
    )
    assert not [f for f in findings if f.status in ("warning", "error")]  # vLLM 0.29.0 as pinned


# -- documented commands and the recipe -------------------------------------------------------
def test_the_documented_check_command_runs_as_written(capsys, monkeypatch):
    """docs/cli.md's example, as the shell splits it."""
    from precision_plugin.cli import main

    text = (ROOT / "docs" / "cli.md").read_text()
    (line,) = [
        ln
        for ln in text.splitlines()
        if ln.startswith("precision-plugin openrlhf-args --check -- --")
    ]
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    assert main(shlex.split(line)[1:]) == 1  # OpenRLHF's bf16 engines: one contradiction
    assert "1 contradiction(s) with the float16 policy" in capsys.readouterr().out


def recipe_args(variables: dict[str, str]) -> list[str]:
    """The ARGS array of integrations/openrlhf/train_ppo_ray.sh, variables filled, with the
    learner arguments the script takes from precision-plugin openrlhf-args."""
    text = (ROOT / "integrations" / "openrlhf" / "train_ppo_ray.sh").read_text()
    block = text.split("ARGS=(", 1)[1].split("\n)", 1)[0]
    args = []
    for word in shlex.split(block, comments=True):
        if word == "${LEARNER[@]}":
            args += orl.args(variables["DTYPE"])
            continue
        for name, value in variables.items():
            word = word.replace(f"${name}", value)
        args.append(word)
    assert not [a for a in args if "$" in a], args
    return args


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_recipe_parses_with_openrlhfs_parser_and_checks_clean(llama_dir, monkeypatch, dtype):
    variables = {
        "MODEL": llama_dir,
        "REWARD_MODEL": llama_dir,
        "DATA": "/tmp/prompts",
        "INPUT_KEY": "context_messages",
        "NGPUS": "8",
        "DTYPE": dtype,
    }
    monkeypatch.setenv("PRECISION_PLUGIN", dtype)  # the script exports it
    parsed = orl.parse_args(recipe_args(variables))
    assert parsed.ds.param_dtype == {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    assert parsed.algo.advantage.is_correction_level == "token"  # vllm_kl is logged
    findings = orl.check_args(parsed, PrecisionPolicy(dtype=dtype, strictness="error"))
    assert not [f for f in findings if f.status in ("error", "warning")]
