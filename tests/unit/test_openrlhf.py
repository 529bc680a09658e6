"""The OpenRLHF adapter without OpenRLHF: arguments, runtime env, the argument check, the
readers of OpenRLHF's source, the engine enforcement of OpenRLHF-built engines, the CLI.

Real OpenRLHF (its parser, engine creation, a Ray cluster) is exercised by
tests/contract_openrlhf/ in its own environment.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin import openrlhf as orl
from precision_plugin._base import versions
from precision_plugin._core import frameworks
from precision_plugin.cli import main
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.openrlhf import check as check_module
from precision_plugin.openrlhf.installed import (
    RELEASED_WEIGHT_SYNC,
    Installed,
    WeightSync,
    engine_dtype,
    parser_flags,
    weight_sync,
)
from precision_plugin.openrlhf.layout import WORKER_EXTENSION
from precision_plugin.vllm.enforce import enforce_on_engine_args
from tests.unit.test_vllm_enforce import EngineArgs as VLLMEngineArgs

NEW, OLD = "0.11.2", "0.11.0"
STRICT = PrecisionPolicy(strictness="error")
FP16_ENV = {"PRECISION_PLUGIN": "float16"}


def parsed(**changes: Any) -> SimpleNamespace:
    """OpenRLHF 0.11.2's parsed arguments (after hierarchize), the precision-relevant part."""
    flat = {
        "ds.param_dtype": "fp16",
        "ds.tensor_parallel_size": 1,
        "ds.load_in_4bit": False,
        "vllm.num_engines": 2,
        "actor.model_name_or_path": "some/hub-model",
        "algo.advantage.is_correction_level": "off",
        **changes,
    }
    root: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def build(node: Any) -> Any:
        return (
            SimpleNamespace(**{k: build(v) for k, v in node.items()})
            if isinstance(node, dict)
            else node
        )

    return build(root)


def problems(args: Any, policy: Any = None, environ: Any = None, version: str = NEW) -> list:
    found = orl.find_problems(args, policy, openrlhf_version=version, environ=environ or {})
    return [f for f in found if f.status == "error"]


@pytest.fixture(autouse=True)
def no_openrlhf_vllm(monkeypatch):
    """As in the main environment: neither OpenRLHF nor vLLM installed (tests that need one
    say so)."""
    real = versions.package_info
    monkeypatch.setattr(
        versions,
        "package_info",
        lambda module: None if module in ("openrlhf", "vllm") else real(module),
    )
    monkeypatch.setattr(check_module, "installed", lambda: None)
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


# -- arguments and runtime env ------------------------------------------------------------------
def test_args_spell_the_policy_dtype_for_every_supported_version():
    for version in ("0.10.2", OLD, NEW):
        assert orl.args(openrlhf_version=version) == ["--ds.param_dtype", "fp16"]
    assert orl.args("bfloat16") == ["--ds.param_dtype", "bf16"]
    assert orl.args({"dtype": "bf16"}) == ["--ds.param_dtype", "bf16"]


def test_args_follow_the_environment(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", "bfloat16")
    assert orl.args() == ["--ds.param_dtype", "bf16"]


def test_args_refuse_what_openrlhf_cannot_run():
    with pytest.raises(PrecisionConfigError, match="bf16 or fp16 only"):
        orl.args("float32")
    with pytest.raises(PrecisionConfigError, match=r"OpenRLHF 0\.10\.1 .*--param_dtype"):
        orl.args(openrlhf_version="0.10.1")
    with pytest.raises(PrecisionConfigError) as err:
        orl.args(openrlhf_version="latest")
    assert str(err.value) == (
        "args(): argument 'openrlhf_version' got 'latest', which is not a version number; pass "
        "OpenRLHF's version such as '0.11.2', or leave it out for the installed one."
    )  # a version the adapter supports (>= 0.10.2), not verl's '0.9.1'
    with pytest.raises(PrecisionConfigError, match="argument 'policy' got float"):
        orl.args(3.5)  # type: ignore[arg-type]


def test_args_are_feature_detected_in_the_installed_parser(monkeypatch):
    from precision_plugin._base.versions import parse_version
    from precision_plugin.openrlhf import launch

    fake = Installed(
        parse_version(NEW), Path("/x"), frozenset({"--other"}), "bfloat16", RELEASED_WEIGHT_SYNC
    )
    monkeypatch.setattr(launch, "installed", lambda: fake)
    with pytest.raises(PrecisionConfigError, match=r"declares no --ds\.param_dtype"):
        orl.args(openrlhf_version=NEW)
    assert orl.args(openrlhf_version=OLD) == ["--ds.param_dtype", "fp16"]  # another version


def test_runtime_env_merges_openrlhfs_own_variables(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", raising=False)
    assert orl.runtime_env() == {
        "env_vars": {
            "TOKENIZERS_PARALLELISM": "true",
            "NCCL_DEBUG": "INFO",  # the user's value, as OpenRLHF's own ray.init reads it
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
            "PRECISION_PLUGIN": "float16",
        }
    }


def test_runtime_env_carries_a_whole_policy_as_json():
    policy = PrecisionPolicy(strictness="error", loss_scaler={"growth_interval": 200})
    value = orl.runtime_env(policy)["env_vars"]["PRECISION_PLUGIN"]
    assert value.startswith("{")
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": value}) == policy
    assert orl.runtime_env("bfloat16")["env_vars"]["PRECISION_PLUGIN"] == "bfloat16"


def test_the_dtype_table_is_frameworks_one():
    assert frameworks.openrlhf_param_dtype(PrecisionPolicy()) == "fp16"
    assert frameworks.openrlhf_param_dtype(PrecisionPolicy(dtype="float32")) is None
    assert frameworks.openrlhf_learner_dtype("bf16") == "bfloat16"
    assert frameworks.openrlhf_learner_dtype("no") is None


# -- check_args ---------------------------------------------------------------------------------
def test_a_consistent_run_has_no_contradiction():
    assert problems(parsed(), environ=FP16_ENV) == []
    assert problems(parsed(**{"ds.param_dtype": "bf16"}), "bfloat16") == []  # bf16 everywhere


def test_the_same_arguments_read_nested_flat_or_as_a_dict():
    flat = argparse.Namespace(**{"ds.param_dtype": "bf16", "vllm.num_engines": 1})
    nested = {"ds": {"param_dtype": "bf16"}, "vllm": {"num_engines": 1}}
    dotted = {"ds.param_dtype": "bf16", "vllm.num_engines": 1}
    found = [[p.message for p in problems(a)] for a in (flat, nested, dotted)]
    assert found[0] == found[1] == found[2] and len(found[0]) == 2


def test_fp16_learner_with_openrlhfs_bf16_engines_names_the_sync_failure_and_the_fix():
    (engine,) = problems(parsed())
    assert engine.message == (
        "OpenRLHF's vLLM engines sample in bfloat16 (create_vllm_engines hard-codes "
        "dtype='bfloat16') while the policy is float16; the first weight sync then fails "
        "(WorkerWrap.update_weight asserts the dtypes match: 'mismatch dtype: src "
        "torch.float16, dst torch.bfloat16')"
    )
    submit = json.dumps(orl.runtime_env(), separators=(",", ":"))
    assert engine.fix == (
        "export PRECISION_PLUGIN=float16 before the run, so that the Ray cluster it starts gives "
        f"it to every actor (on a running cluster: ray job submit --runtime-env-json '{submit}' "
        "-- python3 -m openrlhf.cli.train_ppo_ray ...)"
    )


def test_every_contradiction_is_raised_in_one_error_or_logged_as_one_warning(caplog):
    args = parsed(
        **{"ds.param_dtype": "bf16", "ds.tensor_parallel_size": 4, "ds.load_in_4bit": True}
    )
    with pytest.raises(PrecisionMismatchError) as err:
        orl.check_args(args, STRICT, openrlhf_version=NEW)
    text = str(err.value)
    assert "in 4 place(s)" in text
    for part in (
        "(1) the learner trains in bfloat16",
        "(2) --ds.tensor_parallel_size 4",
        "(3) --ds.load_in_4bit",
        "(4) OpenRLHF's vLLM engines",
    ):
        assert part in text
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        found = orl.check_args(args, openrlhf_version=NEW)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert "in 4 place(s)" in caplog.text and "OpenRLHF runs as configured" in caplog.text
    assert len([f for f in found if f.status == "error"]) == 4


def test_the_learner_fix_is_the_args_of_that_version():
    (learner, _) = problems(parsed(**{"ds.param_dtype": "bf16"}))
    assert (
        learner.message
        == "the learner trains in bfloat16 (--ds.param_dtype bf16) while the policy is float16"
    )
    assert learner.fix == "add --ds.param_dtype fp16 (or $(precision-plugin openrlhf-args))"
    (learner,) = problems(parsed(), "bfloat16")
    assert learner.fix.startswith("add --ds.param_dtype bf16")
    learner, engines = problems(parsed(**{"ds.param_dtype": "bf16"}), "float32")
    assert "bf16 or fp16 only" in learner.message
    assert "sample in bfloat16" in engines.message


def test_engines_follow_the_variable_and_name_its_value():
    assert problems(parsed(), environ={"PRECISION_PLUGIN": '{"dtype": "float16"}'}) == []
    (engine,) = problems(parsed(), environ={"PRECISION_PLUGIN": "bfloat16"})
    assert "sample in bfloat16 (PRECISION_PLUGIN=bfloat16 in this environment)" in engine.message
    off = {"PRECISION_PLUGIN": '{"dtype": "float16", "vllm": {"enforce_dtype": false}}'}
    (engine,) = problems(parsed(), environ=off)
    assert "hard-codes dtype='bfloat16'" in engine.message
    assert problems(parsed(**{"vllm.num_engines": 0})) == []  # no vLLM engines at all


def test_bf16_only_features_are_fine_under_a_bf16_policy():
    args = parsed(
        **{"ds.param_dtype": "bf16", "ds.tensor_parallel_size": 2, "ds.load_in_4bit": True}
    )
    assert problems(args, "bfloat16") == []


@pytest.mark.parametrize(
    ("sync", "reached", "expected"),
    [
        (WeightSync(asserts=True, casts_to="bfloat16"), True, "get bfloat16-rounded weights"),
        (
            WeightSync(asserts=False, casts_to="bfloat16"),
            False,
            "bfloat16-rounded weights without an error",
        ),
        (WeightSync(asserts=True, casts_to="runtime"), True, None),
        (WeightSync(asserts=False, casts_to=None), False, "sample in bfloat16"),
    ],
)
def test_the_installed_weight_sync_decides_what_the_mismatch_does(
    monkeypatch, sync, reached, expected
):
    from precision_plugin._base.versions import parse_version

    fake = Installed(parse_version(NEW), Path("/x"), frozenset(), "bfloat16", sync)
    monkeypatch.setattr(check_module, "installed", lambda: fake)
    found = problems(parsed(), environ=FP16_ENV if reached else {})
    if expected is None:
        assert found == []
    else:
        (problem,) = found
        assert expected in problem.message
        assert "first weight sync then fails" not in problem.message


@pytest.mark.parametrize(("vllm", "flagged"), [("0.10.1", True), ("0.29.0", False)])
def test_the_cascade_guard_is_needed_where_vllm_has_the_bug(monkeypatch, vllm, flagged):
    fake = versions.PackageInfo("vllm", "vllm", versions.parse_version(vllm))
    monkeypatch.setattr(versions, "package_info", lambda m: fake if m == "vllm" else None)
    monkeypatch.setattr(
        versions, "accelerator", lambda: versions.AcceleratorInfo("cpu", "cpu", None, True, True)
    )
    found = problems(parsed(), environ={})
    cascade = [p for p in found if "disable_cascade_attn" in p.message]
    assert bool(cascade) is flagged
    assert [p for p in problems(parsed(), environ=FP16_ENV) if "cascade" in p.message] == []


def test_a_checkpoint_vllm_refuses_in_fp16_is_named(tmp_path):
    folder = tmp_path / "gemma2"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "gemma2", "torch_dtype": "bfloat16"})
    )
    found = problems(parsed(**{"actor.model_name_or_path": str(folder)}), environ=FP16_ENV)
    (refusal,) = found
    assert refusal.framework == "vllm" and "gemma2" in refusal.message


def test_loss_scaler_settings_openrlhf_cannot_pass():
    all_found = orl.find_problems(
        parsed(), PrecisionPolicy(), openrlhf_version=NEW, environ=FP16_ENV
    )
    (note,) = [f for f in all_found if "loss scaler" in f.message]
    assert note.status == "info" and "growth_interval=1000" in note.message
    (problem,) = problems(parsed(), {"loss_scaler": {"growth_interval": 200}}, FP16_ENV)
    assert (
        "loss_scaler growth_interval=200" in problem.message
        and "growth_interval=1000" in problem.message
    )
    (problem,) = problems(parsed(), {"loss_scaler": {"enabled": False}}, FP16_ENV)
    assert "loss_scaler enabled=False" in problem.message
    # DeepSpeed's own value asked explicitly is no contradiction
    assert problems(parsed(), {"loss_scaler": {"growth_interval": 1000}}, FP16_ENV) == []


def test_importance_sampling_flags_by_version():
    def advice(args: Any, version: str, policy: PrecisionPolicy | None = None) -> list:
        found = orl.find_problems(
            args, policy or PrecisionPolicy(), openrlhf_version=version, environ=FP16_ENV
        )
        return [f for f in found if f.status == "warning"]

    (new,) = advice(parsed(), NEW)
    assert "--algo.advantage.is_correction_level token" in new.fix
    old_args = parsed(**{"algo.advantage.is_correction_level": None})
    del old_args.algo.advantage.is_correction_level
    (old,) = advice(old_args, OLD)
    assert "--algo.advantage.is_correction_enable" in old.fix
    assert advice(parsed(**{"algo.advantage.is_correction_level": "seq"}), NEW) == []
    assert advice(parsed(), NEW, PrecisionPolicy(metrics={"enabled": False})) == []
    # the other generation's switch is a contradiction
    (wrong,) = problems(parsed(), environ=FP16_ENV, version=OLD)
    assert "a flag of OpenRLHF >= 0.11.2" in wrong.message
    assert wrong.fix.startswith("use --algo.advantage.is_correction_enable")


def test_ray_address_gets_a_note(monkeypatch):
    env = {**FP16_ENV, "RAY_ADDRESS": "10.0.0.1:6379"}
    found = orl.find_problems(parsed(), PrecisionPolicy(), openrlhf_version=NEW, environ=env)
    assert any("RAY_ADDRESS is set" in f.message for f in found if f.status == "info")


def test_bad_arguments_are_refused_at_the_boundary():
    with pytest.raises(PrecisionConfigError, match="parse_args"):
        orl.check_args(["--ds.param_dtype", "fp16"])
    with pytest.raises(PrecisionConfigError, match="parse_args"):
        orl.check_args(None)
    with pytest.raises(PrecisionConfigError, match=r"argument 'argv' got str .* a lone string"):
        orl.parse_args("--ds.param_dtype fp16")  # type: ignore[arg-type]


def test_a_count_openrlhfs_parser_would_refuse_is_named_not_a_raw_error():
    for bad in ("two", 2.5):
        with pytest.raises(PrecisionConfigError) as err:
            orl.check_args(parsed(**{"ds.tensor_parallel_size": bad}), STRICT)
        message = str(err.value)
        assert message.startswith(
            f"OpenRLHF: ds.tensor_parallel_size (--ds.tensor_parallel_size) in the parsed "
            f"arguments is {bad!r}"
        ), message
        assert "integer" in message, message
    ok = orl.find_problems(parsed(**{"ds.tensor_parallel_size": "1"}), STRICT, environ=FP16_ENV)
    assert not [f for f in ok if f.status == "error"]


def test_parse_args_without_openrlhf_says_where_to_run_it():
    with pytest.raises(PrecisionConfigError, match=r"cannot import openrlhf\.cli\.train_ppo_ray"):
        orl.parse_args(["--ds.param_dtype", "fp16"])


# -- reading OpenRLHF's source --------------------------------------------------------------------
PARSER = """
parser.add_argument("--ds.param_dtype", type=str, default="bf16", choices=["bf16", "fp16"])
parser.add_argument("--algo.advantage.is_correction_level", type=str, default="off")
for prefix in ("actor", "critic"):
    parser.add_argument(f"--{prefix}.optim", type=str)
"""
ENGINES = """
def create_vllm_engines(num_engines, pretrain):
    for i in range(num_engines):
        actor_kwargs = {"model": pretrain, "dtype": "bfloat16", "seed": i}
"""
WORKER = """
class WorkerWrap:
    def update_weight(self, name, dtype, shape, empty_cache=False):
        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
"""
ACTOR = """
class PolicyModelActor:
    def broadcast_to_vllm(self):
        def _broadcast_param(param, count, num_params):
            {line}
            refs = [engine.update_weight.remote(name, dtype=param.dtype, shape=param.shape)]
"""


def test_parser_flags_and_engine_dtype_are_read_from_the_source():
    assert parser_flags(PARSER) == {"--ds.param_dtype", "--algo.advantage.is_correction_level"}
    assert engine_dtype(ENGINES) == "bfloat16"
    assert engine_dtype(ENGINES.replace('"bfloat16"', "torch.float16")) == "float16"
    assert engine_dtype("def create_vllm_engines():\n    return {}\n") is None
    assert parser_flags("not python (") == frozenset()


@pytest.mark.parametrize(
    ("line", "casts_to"),
    [
        ("pass", None),
        ("param = param.data.to(torch.bfloat16)", "bfloat16"),
        ("param = param.to(dtype=torch.bfloat16)", "bfloat16"),
        ("param = param.bfloat16()", "bfloat16"),
        ("param = param.to(self.engine_dtype)", "runtime"),
        ("param = param.to('cuda')", None),
    ],
)
def test_the_weight_sync_is_classified_from_the_source(line, casts_to):
    found = weight_sync(WORKER, ACTOR.format(line=line))
    assert found == WeightSync(asserts=True, casts_to=casts_to)
    assert weight_sync("", ACTOR.format(line=line)).asserts is False  # no assert found


def test_installed_is_none_without_openrlhf():
    from precision_plugin.openrlhf.installed import installed

    installed.cache_clear()
    assert installed() is None
    from precision_plugin.openrlhf.doctor import doctor_findings

    assert doctor_findings(PrecisionPolicy()) == []


# -- engines OpenRLHF built, inside the engine process -----------------------------------------
@dataclass
class EngineArgs(VLLMEngineArgs):
    """The stand-in of tests/unit/test_vllm_enforce.py, with the field OpenRLHF sets."""

    worker_extension_cls: str = ""


def test_openrlhfs_hard_coded_dtype_is_replaced_even_strict_and_logged(caplog):
    args = EngineArgs(dtype="bfloat16", worker_extension_cls=WORKER_EXTENSION)
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        enforce_on_engine_args(args, STRICT)
    assert args.dtype == "float16"
    assert caplog.messages == [
        "precision_plugin: OpenRLHF hard-codes dtype='bfloat16' for its vLLM engines; this "
        "engine for 'facebook/opt-125m' runs float16, the precision policy's dtype."
    ]


def test_a_users_own_dtype_is_still_a_conflict_and_enforce_off_keeps_openrlhfs():
    with pytest.raises(PrecisionMismatchError):
        enforce_on_engine_args(EngineArgs(dtype="bfloat16"), STRICT)
    args = EngineArgs(dtype="bfloat16", worker_extension_cls=WORKER_EXTENSION)
    enforce_on_engine_args(args, PrecisionPolicy(vllm={"enforce_dtype": False}))
    assert args.dtype == "bfloat16"
    same = EngineArgs(dtype="bfloat16", worker_extension_cls=WORKER_EXTENSION)
    enforce_on_engine_args(same, PrecisionPolicy(dtype="bfloat16"))
    assert same.dtype == "bfloat16"


# -- command line -------------------------------------------------------------------------------
def test_cli_prints_the_args_and_the_runtime_env(capsys):
    assert main(["openrlhf-args"]) == 0
    assert capsys.readouterr().out.split() == ["--ds.param_dtype", "fp16"]
    assert main(["openrlhf-args", "--dtype", "bf16", "--openrlhf-version", OLD]) == 0
    assert capsys.readouterr().out.split() == ["--ds.param_dtype", "bf16"]
    assert main(["openrlhf-args", "--runtime-env"]) == 0
    assert json.loads(capsys.readouterr().out) == orl.runtime_env()


def test_cli_refuses_bad_input_in_one_line(capsys):
    assert main(["openrlhf-args", "--dtype", "fp32"]) == 2
    assert "bf16 or fp16 only" in capsys.readouterr().err
    assert main(["openrlhf-args", "--", "--ds.param_dtype", "fp16"]) == 2
    assert "pass --check -- ARGS" in capsys.readouterr().err
    assert main(["openrlhf-args", "--check", "--", "--ds.param_dtype", "fp16"]) == 2
    assert "cannot import openrlhf.cli.train_ppo_ray" in capsys.readouterr().err
    assert main(["openrlhf-args", "--runtime-env", "--check"]) == 2


def test_doctor_knows_what_an_openrlhf_run_also_runs():
    from precision_plugin.doctor import frameworks_in_use

    assert frameworks_in_use(["openrlhf"]) == ("deepspeed", "openrlhf", "transformers", "vllm")
