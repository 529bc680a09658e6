"""The verl adapter without verl: override translation per version/strategy, the config check.

Real verl (composed ``ppo_trainer`` configs, its dataclasses and plugin loader) is exercised by
tests/contract_verl/ in its own environments.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin.cli import main
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.verl import check_config, layout, overrides
from precision_plugin.verl.plugin import check_section, section_config

NEW, OLD = "0.9.1", "0.7.1"
NO_VLLM = {"vllm_version": None, "gpu_capability": None}


def _fsdp_section() -> dict[str, Any]:
    # verl's YAML has no mixed_precision key: FSDPEngineConfig.mixed_precision defaults to None.
    return {"strategy": "fsdp", "dtype": "bfloat16", "model_dtype": "fp32"}


def verl_defaults(version: str, strategy: str = "fsdp") -> dict[str, Any]:
    """The precision-relevant part of verl's default ppo(_megatron)_trainer config."""
    lay = layout(version, strategy)
    cfg: dict[str, Any] = {
        "actor_rollout_ref": {
            "actor": {"strategy": strategy, "use_kl_loss": False},
            "ref": {},
            "rollout": {
                "name": "vllm",
                "dtype": "bfloat16",
                "calculate_log_probs": version >= "0.9",
                "engine_kwargs": {"vllm": {}},
            },
            "model": {"lora_rank": 0},
        },
        "critic": {"strategy": strategy, "enable": None, "model": {}},
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "trainer": {"use_legacy_worker_impl": "auto"},
        "ray_kwargs": {"ray_init": {"num_cpus": None}},
    }
    for path in lay.learners.values():
        section = {"dtype": "bfloat16"} if strategy == "megatron" else _fsdp_section()
        set_path(cfg, path, section)
    return cfg


def set_path(cfg: dict[str, Any], path: str, value: Any) -> None:
    """Hydra's ``++path=value`` on a plain dict (creates missing levels)."""
    *parents, last = path.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def apply(cfg: dict[str, Any], overrides_: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides the way Hydra does for these simple values."""
    out = copy.deepcopy(cfg)
    for item in overrides_:
        key, value = item.lstrip("+").split("=", 1)
        parsed: Any = {"True": True, "False": False}.get(value, value.strip("'"))
        set_path(out, key, parsed)
    return out


# -- overrides ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "critic"),
    [(NEW, "critic.fsdp"), ("0.8.0", "critic.fsdp"), (OLD, "critic.model.fsdp_config")],
)
def test_fsdp_overrides_set_both_fsdp_keys_for_every_learner(version, critic):
    got = overrides("float16", verl_version=version, **NO_VLLM)
    assert "actor_rollout_ref.rollout.dtype=float16" in got
    for section in (
        "actor_rollout_ref.actor.fsdp_config",
        "actor_rollout_ref.ref.fsdp_config",
        critic,
    ):
        assert f"{section}.dtype=float16" in got
        assert f"++{section}.mixed_precision.param_dtype=fp16" in got
    assert "actor_rollout_ref.rollout.calculate_log_probs=True" in got
    assert got[-1] == "++ray_kwargs.ray_init.runtime_env.env_vars.PRECISION_PLUGIN=float16"


def test_megatron_overrides_use_megatron_dtype_only():
    got = overrides("bfloat16", verl_version=NEW, strategy="megatron", **NO_VLLM)
    learner = [o for o in got if "megatron" in o]
    assert learner == [
        "actor_rollout_ref.actor.megatron.dtype=bfloat16",
        "actor_rollout_ref.ref.megatron.dtype=bfloat16",
        "critic.megatron.dtype=bfloat16",
    ]
    assert not any("fsdp" in o or "mixed_precision" in o for o in got)


def test_megatron_refuses_float32_and_unknown_strategies_are_refused():
    with pytest.raises(PrecisionConfigError, match="bfloat16 or float16"):
        overrides("float32", strategy="megatron", **NO_VLLM)
    with pytest.raises(PrecisionConfigError, match="argument 'strategy' got 'deepspeed'"):
        overrides(strategy="deepspeed", **NO_VLLM)
    with pytest.raises(PrecisionConfigError, match="not a version number"):
        overrides(verl_version="latest", **NO_VLLM)


@pytest.mark.parametrize(
    ("vllm", "capability", "flag"),
    [
        ("0.10.1", (8, 0), True),
        ("0.10.1", (9, 0), False),
        ("0.12.0", (8, 0), False),
        ("0.33.0", (8, 0), False),
        (None, None, False),
    ],
)
def test_cascade_flag_goes_through_the_rollout_engine_kwargs_only_where_needed(
    vllm, capability, flag
):
    got = overrides(verl_version=NEW, vllm_version=vllm, gpu_capability=capability)
    key = "++actor_rollout_ref.rollout.engine_kwargs.vllm.disable_cascade_attn=True"
    assert (key in got) is flag


def test_policy_comes_from_the_environment_and_travels_to_ray_workers(monkeypatch):
    monkeypatch.setenv("PRECISION_PLUGIN", '{"dtype": "bfloat16", "strictness": "error"}')
    got = overrides(verl_version=NEW, **NO_VLLM)
    assert "actor_rollout_ref.rollout.dtype=bfloat16" in got
    env = got[-1].split("=", 1)[1]
    assert env == '\'{"dtype":"bfloat16","strictness":"error"}\''
    assert " " not in env  # one word in $(precision-plugin verl-overrides)
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": env.strip("'")}) == PrecisionPolicy(
        dtype="bfloat16", strictness="error"
    )


def test_overrides_import_no_verl():
    overrides(verl_version=OLD, **NO_VLLM)
    assert "verl" not in sys.modules


@pytest.mark.parametrize("version", [OLD, "0.8.0", NEW])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_defaults_plus_overrides_check_clean(version, dtype):
    cfg = verl_defaults(version)
    cfg["actor_rollout_ref"]["actor"]["use_kl_loss"] = True  # the reference model is in use
    cfg["algorithm"]["adv_estimator"] = "gae"  # and the critic
    # verl's defaults are bf16 everywhere, with mismatch metrics on from 0.9.
    defaults_ok = dtype == "bfloat16" and version >= "0.9"
    assert (check_config(cfg, dtype, verl_version=version) == []) is defaults_ok
    fixed = apply(cfg, overrides(dtype, verl_version=version, **NO_VLLM))
    policy = PrecisionPolicy(dtype=dtype, strictness="error")
    if version == OLD and dtype == "float16":  # the legacy critic autocasts bf16, always
        with pytest.raises(PrecisionMismatchError, match="legacy FSDP critic"):
            check_config(fixed, policy, verl_version=version)
    else:
        assert check_config(fixed, policy, verl_version=version) == []


def test_megatron_defaults_plus_overrides_check_clean():
    cfg = verl_defaults(NEW, "megatron")
    fixed = apply(cfg, overrides("float16", verl_version=NEW, strategy="megatron", **NO_VLLM))
    assert check_config(fixed, "float16", verl_version=NEW) == []
    assert [p.key for p in check_config(cfg, "float16", verl_version=NEW)] == [
        "actor_rollout_ref.rollout.dtype",
        "actor_rollout_ref.actor.megatron.dtype",
    ]


# -- check_config ------------------------------------------------------------------------------
def test_the_fsdp_dtype_trap_is_named_on_verl_08_and_later():
    cfg = apply(
        verl_defaults(NEW),
        [
            "actor_rollout_ref.rollout.dtype=float16",
            "actor_rollout_ref.actor.fsdp_config.dtype=float16",
        ],
    )
    problems = check_config(cfg, "float16", verl_version=NEW)
    assert [p.key for p in problems] == ["actor_rollout_ref.actor.fsdp_config.dtype"]
    assert "ignores" in problems[0].message and "trains in bfloat16" in problems[0].message
    assert "mixed_precision.param_dtype=fp16" in problems[0].fix


def test_the_same_key_is_right_on_legacy_verl_and_mixed_precision_alone_is_not():
    cfg = apply(
        verl_defaults(OLD),
        [
            "actor_rollout_ref.rollout.dtype=float16",
            "actor_rollout_ref.actor.fsdp_config.dtype=float16",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
        ],
    )
    assert check_config(cfg, "float16", verl_version=OLD) == []
    mp_only = apply(
        verl_defaults(OLD),
        [
            "actor_rollout_ref.rollout.dtype=float16",
            "++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
        ],
    )
    (problem,) = check_config(mp_only, "float16", verl_version=OLD)
    assert problem.key == "actor_rollout_ref.actor.fsdp_config.dtype"
    assert "autocast" in problem.message
    split = apply(cfg, ["++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"])
    (problem,) = check_config(split, "float16", verl_version=OLD)
    assert problem.key == "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
    assert "FSDP parameters in bfloat16" in problem.message


def test_every_contradiction_is_named_in_one_error():
    cfg = verl_defaults(NEW)
    cfg["actor_rollout_ref"]["rollout"]["calculate_log_probs"] = False
    cfg["actor_rollout_ref"]["actor"]["use_kl_loss"] = True
    cfg["actor_rollout_ref"]["model"]["lora"] = {"rank": 16, "merge": True}
    cfg["actor_rollout_ref"]["rollout"]["checkpoint_engine"] = {"backend": "delta_sharded"}
    policy = PrecisionPolicy(strictness="error")
    with pytest.raises(PrecisionMismatchError) as err:
        check_config(cfg, policy, verl_version=NEW)
    text = str(err.value)
    for key in (
        "actor_rollout_ref.rollout.dtype",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
        "actor_rollout_ref.model.lora.merge",
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "actor_rollout_ref.rollout.calculate_log_probs",
    ):
        assert key in text
    assert "6 place(s)" in text and "reference model" in text


def test_warn_strictness_logs_and_returns_the_contradictions(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        problems = check_config(verl_defaults(NEW), "float16", verl_version=NEW)
    assert len(problems) == 2  # rollout dtype and actor dtype; metrics are on in 0.9
    (record,) = caplog.records
    assert "2 place(s)" in record.getMessage()


def test_new_engine_on_verl_07_has_no_loss_scaler():
    cfg = apply(verl_defaults(OLD), overrides("float16", verl_version=OLD, **NO_VLLM))
    cfg["trainer"]["use_legacy_worker_impl"] = "disable"
    (problem,) = check_config(cfg, "float16", verl_version=OLD)
    assert problem.key == "trainer.use_legacy_worker_impl" and "loss scaler" in problem.message
    assert (
        check_config(cfg, "bfloat16", verl_version=OLD)[0].key == "actor_rollout_ref.rollout.dtype"
    )


@dataclasses.dataclass
class _Engine:
    strategy: str = "fsdp"
    dtype: str = "float16"
    mixed_precision: dict[str, str] | None = None


@dataclasses.dataclass
class _Actor:
    strategy: str = "fsdp"
    fsdp_config: _Engine = dataclasses.field(default_factory=_Engine)


@dataclasses.dataclass
class _Rollout:
    dtype: str = "float16"
    calculate_log_probs: bool = True


def test_check_reads_dataclasses_and_attribute_objects():
    cfg = SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor=_Actor(), rollout=_Rollout()))
    (problem,) = check_config(cfg, "float16", verl_version=NEW)
    assert problem.key == "actor_rollout_ref.actor.fsdp_config.dtype"
    cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision = {"param_dtype": "fp16"}
    assert check_config(cfg, "float16", verl_version=NEW) == []


# -- in-worker sections ------------------------------------------------------------------------
def test_worker_sections_are_checked_one_by_one():
    assert section_config(_Rollout()) == {"actor_rollout_ref": {"rollout": _Rollout()}}
    assert section_config(SimpleNamespace(lr=1.0)) is None
    # a generative reward model's rollout: a RolloutConfig without log-probs, not the policy's
    assert section_config(_Rollout(dtype="bfloat16", calculate_log_probs=False)) is None
    strict = PrecisionPolicy(strictness="error")
    assert check_section(_Rollout(), strict) == []
    with pytest.raises(PrecisionMismatchError, match="ignores"):
        check_section(_Actor(), strict)
    with pytest.raises(PrecisionMismatchError, match="samples in bfloat16"):
        check_section(_Rollout(dtype="bfloat16"), strict)


def test_plugin_module_changes_nothing_without_the_env_var(monkeypatch):
    import precision_plugin.verl.plugin as plugin

    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    assert plugin.install() is False
    assert len(plugin._patcher) == 0


# -- command line and doctor -------------------------------------------------------------------
def test_cli_prints_the_overrides_one_per_line(capsys, monkeypatch):
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    args = ["verl-overrides", "--dtype", "bf16", "--verl-version", OLD, "--strategy", "megatron"]
    assert main(args) == 0
    printed = capsys.readouterr().out.split()
    assert printed == overrides("bfloat16", verl_version=OLD, strategy="megatron")
    assert main(["verl-overrides", "--strategy", "megatron", "--dtype", "fp32"]) == 2


def test_doctor_reports_nothing_without_verl():
    from precision_plugin._base.versions import package_info
    from precision_plugin.verl.doctor import doctor_findings

    if package_info("verl") is not None:
        pytest.skip("verl is installed here")
    assert doctor_findings(PrecisionPolicy()) == []


def test_a_loss_scaler_verl_cannot_run_is_named():
    cfg = apply(verl_defaults(NEW), overrides("float16", verl_version=NEW, **NO_VLLM))
    policy = PrecisionPolicy(loss_scaler={"growth_interval": 200})
    (problem,) = check_config(cfg, policy, verl_version=NEW)
    assert "growth_interval=200" in problem.message and "growth_interval=400" in problem.message
    megatron = apply(
        verl_defaults(NEW, "megatron"),
        overrides("float16", verl_version=NEW, strategy="megatron", **NO_VLLM),
    )
    assert check_config(megatron, policy, verl_version=NEW, strategy="megatron") == []
    assert check_section(_Rollout(), policy.replace(strictness="error")) == []  # no learner here


# -- FSDP-Turbo (verl >= 0.9.1) ------------------------------------------------------------------
TURBO_KEY = "turbo_config.distributed.fsdp_plan.param_dtype"


def test_fsdp_turbo_is_refused_for_float16_and_float32():
    for dtype in ("float16", "float32"):
        with pytest.raises(PrecisionConfigError, match=r"FSDP-Turbo.*always computes in bfloat16"):
            overrides(dtype, verl_version=NEW, strategy="fsdp_turbo", **NO_VLLM)


def test_fsdp_turbo_overrides_for_bfloat16_set_its_parameter_dtype_and_check_clean():
    got = overrides("bfloat16", verl_version=NEW, strategy="fsdp_turbo", **NO_VLLM)
    for section in (
        "actor_rollout_ref.actor.fsdp_config",
        "actor_rollout_ref.ref.fsdp_config",
        "critic.fsdp",
    ):
        assert f"++{section}.{TURBO_KEY}=bf16" in got
    cfg = verl_defaults(NEW, "fsdp_turbo")
    cfg["algorithm"]["adv_estimator"] = "gae"  # the critic too
    set_path(cfg, f"actor_rollout_ref.actor.fsdp_config.{TURBO_KEY}", "fp16")
    set_path(cfg, f"critic.fsdp.{TURBO_KEY}", "fp16")
    problems = check_config(cfg, "bfloat16", verl_version=NEW)
    assert [p.key for p in problems] == [
        f"actor_rollout_ref.actor.fsdp_config.{TURBO_KEY}",
        f"critic.fsdp.{TURBO_KEY}",
    ]
    assert "keeps its parameters in float16 but autocasts in bfloat16" in problems[0].message
    assert check_config(apply(cfg, got), "bfloat16", verl_version=NEW) == []


def test_fsdp_turbo_ignores_every_float16_key_and_is_named_per_learner():
    fp16 = overrides("float16", verl_version=NEW, **NO_VLLM)  # every FSDP float16 key set
    cfg = apply(verl_defaults(NEW, "fsdp_turbo"), fp16)
    cfg["actor_rollout_ref"]["actor"]["use_kl_loss"] = True  # the reference model is in use
    for path in layout(NEW).learners.values():
        set_path(cfg, f"{path}.{TURBO_KEY}", "fp16")
    problems = check_config(cfg, "float16", verl_version=NEW)
    assert [p.key for p in problems] == ["actor_rollout_ref.actor.strategy"] * 2
    assert "the actor (learner) uses strategy=fsdp_turbo" in problems[0].message
    assert "the reference model uses strategy=fsdp_turbo" in problems[1].message
    assert "autocasts in bfloat16 with no loss scaler" in problems[0].message
    with pytest.raises(PrecisionMismatchError, match=r"2 place\(s\).*fsdp_turbo"):
        check_config(cfg, PrecisionPolicy(strictness="error"), verl_version=NEW)
    # the critic has a strategy of its own
    cfg["algorithm"]["adv_estimator"] = "gae"
    cfg["critic"]["strategy"] = "fsdp"
    keys = [p.key for p in check_config(cfg, "float16", verl_version=NEW)]
    assert keys == ["actor_rollout_ref.actor.strategy"] * 2  # the FSDP critic follows its keys
    cfg["actor_rollout_ref"]["actor"]["strategy"] = "fsdp"
    cfg["critic"]["strategy"] = "fsdp_turbo"
    assert [p.key for p in check_config(cfg, "float16", verl_version=NEW)] == ["critic.strategy"]


def test_fsdp_turbo_exists_from_verl_091():
    with pytest.raises(PrecisionConfigError, match=r"exists from verl 0\.9\.1"):
        overrides("bfloat16", verl_version="0.9.0", strategy="fsdp_turbo", **NO_VLLM)
    assert layout("0.9.1", "fsdp_turbo").turbo


def test_a_worker_built_with_fsdp_turbo_is_refused_under_float16():
    turbo = _Actor(
        strategy="fsdp_turbo", fsdp_config=_Engine(mixed_precision={"param_dtype": "fp16"})
    )
    with pytest.raises(PrecisionMismatchError, match="strategy=fsdp_turbo"):
        check_section(turbo, PrecisionPolicy(strictness="error"))


def test_cli_refuses_fsdp_turbo_overrides_for_float16(capsys, monkeypatch):
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    args = ["verl-overrides", "--strategy", "fsdp_turbo", "--verl-version", NEW]
    assert main(args) == 2
    assert "FSDP-Turbo" in capsys.readouterr().err
    assert main([*args, "--dtype", "bf16"]) == 0


@pytest.mark.parametrize("asked", ["0.0.1", "v0.5.0", "0.6.9"])
def test_a_verl_version_older_than_the_checked_keys_is_refused(asked: str) -> None:
    # Before: every version was given the oldest layout without a word.
    from packaging.version import Version

    with pytest.raises(PrecisionConfigError) as refused:
        overrides(PrecisionPolicy(), verl_version=asked)
    assert str(refused.value) == (
        f"verl {Version(asked)} was asked for; precision_plugin knows verl's precision keys from "
        f"0.7 on (checked against 0.7.1, 0.8.0, 0.9.1), and older releases keep them elsewhere. "
        f"Upgrade verl, or set the dtype keys of your version yourself."
    )


def test_a_verl_version_newer_than_the_checked_keys_is_named(caplog) -> None:
    assert overrides(PrecisionPolicy(), verl_version="0.9.7") == overrides(
        PrecisionPolicy(), verl_version=NEW
    )
    assert not caplog.records
    newer = overrides(PrecisionPolicy(), verl_version="0.10.0")
    assert newer == overrides(PrecisionPolicy(), verl_version=NEW)
    assert [r.getMessage() for r in caplog.records] == [
        "precision_plugin: verl 0.10.0 is newer than the releases its keys were checked against "
        "(0.7.1, 0.8.0, 0.9.1); the keys of verl 0.9.1 are used"
    ]
