"""The plugin against real verl: its composed configs, its dataclasses, its plugin loader."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import verl
from conftest import ROOT, VERL_VERSION, compose_verl, run_installed
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.torch_dtypes import PrecisionType

from precision_plugin import PrecisionPolicy
from precision_plugin.errors import PrecisionMismatchError
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE
from precision_plugin.verl import check_config, layout, overrides
from precision_plugin.verl.doctor import doctor_findings

LEGACY = VERL_VERSION.release < (0, 8)
NO_VLLM = {"vllm_version": None, "gpu_capability": None}
STRATEGIES = ["fsdp", "fsdp2", "megatron"]


def learner_dtypes(cfg, strategy: str) -> dict[str, torch.dtype]:
    """The torch dtype each learner computes in, read from verl's own dataclasses the way
    verl's workers read them (after omega_conf_to_dataclass)."""
    out = {}
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    sections = {"actor": actor.megatron if strategy == "megatron" else actor.fsdp_config}
    for role, path in layout(VERL_VERSION, strategy).learners.items():
        if role != "actor":
            node = cfg
            for part in path.split("."):
                node = node[part]
            sections[role] = omega_conf_to_dataclass(node)
    for role, engine in sections.items():
        if strategy == "megatron":
            out[role] = PrecisionType.to_dtype(engine.dtype)  # McoreEngineConfig.dtype
        elif LEGACY and role != "critic":
            out[role] = PrecisionType.to_dtype(engine.dtype)  # legacy dp_actor autocast/scaler
            if engine.mixed_precision is not None:  # legacy FSDP param dtype
                mp = PrecisionType.to_dtype(engine.mixed_precision["param_dtype"])
                assert mp == out[role], f"{role}: FSDP params {mp}, autocast {out[role]}"
        elif LEGACY:  # the legacy critic: FSDP params from mixed_precision, autocast below
            out[role] = legacy_critic_autocast()
        else:  # FSDP engine: mixed_precision, default bf16
            mp = engine.mixed_precision or {}
            out[role] = PrecisionType.to_dtype(mp.get("param_dtype", "bf16"))
    return out


def legacy_critic_autocast() -> torch.dtype:
    """The autocast dtype of verl <= 0.7's legacy FSDP critic, read from its source."""
    source = (Path(verl.__file__).parent / "workers" / "critic" / "dp_critic.py").read_text()
    found = re.search(
        r"torch\.autocast\(device_type=self\.device_name, dtype=torch\.(\w+)\)", source
    )
    assert found, "verl's legacy critic no longer autocasts in a fixed dtype"
    return getattr(torch, found.group(1))


def rollout_dtype(cfg) -> torch.dtype:
    """The dtype verl passes to vLLM, from verl's RolloutConfig."""
    return PrecisionType.to_dtype(omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).dtype)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_overrides_make_rollout_and_every_learner_agree(strategy, dtype):
    cfg = compose_verl(overrides(dtype, strategy=strategy, **NO_VLLM), strategy)
    want = PrecisionType.to_dtype(dtype)
    assert rollout_dtype(cfg) == want
    learners = learner_dtypes(cfg, strategy)
    assert set(learners) == {"actor", "ref", "critic"}
    policy = PrecisionPolicy(dtype=dtype, strictness="error")
    if learners["critic"] != want:  # verl <= 0.7's legacy critic: bf16 whatever the config
        assert LEGACY and strategy != "megatron" and dtype == "float16"
        assert cfg.algorithm.adv_estimator == "gae"  # verl's default: the critic is in use
        with pytest.raises(PrecisionMismatchError, match=r"\[critic\.model\.fsdp_config\]"):
            check_config(cfg, policy, strategy=strategy)
        learners.pop("critic")
        cfg.algorithm.adv_estimator = "grpo"  # no critic: everything else must agree
    assert learners == dict.fromkeys(learners, want)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.calculate_log_probs is True
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars["PRECISION_PLUGIN"] == dtype
    assert check_config(cfg, policy, strategy=strategy) == []


def test_verl_defaults_are_bf16_and_check_config_says_where():
    cfg = compose_verl([])
    assert rollout_dtype(cfg) == torch.bfloat16
    assert learner_dtypes(cfg, "fsdp")["actor"] == torch.bfloat16
    keys = [p.key for p in check_config(cfg, "float16")]
    assert "actor_rollout_ref.rollout.dtype" in keys
    assert any(k.startswith("actor_rollout_ref.actor.fsdp_config") for k in keys)


def test_the_trap_key_alone():
    """fsdp_config.dtype=float16 validates on every verl; only verl >= 0.8 ignores it."""
    trap = [
        "algorithm.adv_estimator=grpo",  # no critic (verl <= 0.7's legacy one autocasts bf16)
        "actor_rollout_ref.rollout.dtype=float16",
        "actor_rollout_ref.actor.fsdp_config.dtype=float16",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    ]
    cfg = compose_verl(trap)
    engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).fsdp_config
    assert engine.dtype == "float16" and engine.mixed_precision is None
    strict = PrecisionPolicy(strictness="error")
    if LEGACY:  # the legacy actor autocasts and scales in fsdp_config.dtype: no trap
        assert learner_dtypes(cfg, "fsdp")["actor"] == torch.float16
        assert check_config(cfg, strict) == []
        return
    assert learner_dtypes(cfg, "fsdp")["actor"] == torch.bfloat16  # what the engine runs
    with pytest.raises(PrecisionMismatchError) as err:
        check_config(cfg, strict)
    assert "actor_rollout_ref.actor.fsdp_config.dtype" in str(err.value)
    assert "ignores" in str(err.value)


def fixes_table_overrides() -> list[str]:
    """The Hydra overrides in the attribution's verl fixes (CAUSE_TABLE): each ``key=value`` whose
    key is dotted (``actor_rollout_ref.rollout.top_p=1.0``), a ``+``/``++`` prefix kept; a bare
    ``key=value`` after one ("... top_p=1.0 and top_k=-1") is its sibling, in the same section
    (``actor_rollout_ref.rollout.top_k=-1``). Upper-case words (VLLM_BATCH_INVARIANT=1) are
    environment variables, not overrides, and are not read."""
    found = []
    for cause in CAUSE_TABLE.values():
        section = None
        text = cause.fixes.get("verl", "")
        for plus, key, value in re.findall(r"(?<![\w.+])(\+{0,2})([a-z_][\w.]*)=([^\s,)]+)", text):
            if "." in key:
                section = key.rpartition(".")[0]
            else:
                assert section, f"{key}={value} in {text!r} follows no dotted override"
                key = f"{section}.{key}"
            found.append(f"{plus}{key}={value}")
    return found


#: verl's RolloutConfig.full_determinism came after 0.7.1 (verl PR #6572).
ROLLOUT_DETERMINISM = "actor_rollout_ref.rollout.full_determinism"


def test_fixes_table_verl_overrides_are_the_known_keys():
    """A key dropped from (or added to) the verl fixes is noticed."""
    assert {o.lstrip("+").partition("=")[0] for o in fixes_table_overrides()} == {
        "actor_rollout_ref.rollout.dtype",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        ROLLOUT_DETERMINISM,
        "actor_rollout_ref.rollout.top_p",
        "actor_rollout_ref.rollout.top_k",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype",
    }


@pytest.mark.parametrize("override", fixes_table_overrides())
def test_fixes_table_verl_override_composes_with_verls_config(override):
    """Users copy the attribution's verl fixes onto verl's command line: each override composes
    with verl's own config (Hydra refuses a key it lacks unless the override has a ``+``) and the
    key then holds the value (a misspelt key passed every test before)."""
    key = override.lstrip("+").partition("=")[0]
    if LEGACY and key == ROLLOUT_DETERMINISM:  # absent from verl 0.7.1: Hydra refuses it
        with pytest.raises(ConfigCompositionException, match="Could not override"):
            compose_verl([override])
        return
    cfg = compose_verl([override])
    assert OmegaConf.select(cfg, key) == OverridesParser.create().parse_override(override).value()


def test_cascade_flag_reaches_verls_vllm_engine_kwargs():
    cfg = compose_verl(overrides(vllm_version="0.10.1", gpu_capability=(8, 0)))
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.engine_kwargs["vllm"]["disable_cascade_attn"] is True


def test_json_policy_survives_hydra_and_ray_env():
    policy = PrecisionPolicy(dtype="bfloat16", strictness="error")
    cfg = compose_verl(overrides(policy, **NO_VLLM))
    value = cfg.ray_kwargs.ray_init.runtime_env.env_vars["PRECISION_PLUGIN"]
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": value}) == policy


def test_the_command_line_output_composes_as_the_shell_splits_it():
    cli = [sys.executable, "-m", "precision_plugin", "verl-overrides", "--dtype", "fp16"]
    text = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    cfg = compose_verl(text.split())  # what $(precision-plugin verl-overrides) passes
    assert rollout_dtype(cfg) == torch.float16
    learners = learner_dtypes(cfg, "fsdp")
    assert learners["actor"] == learners["ref"] == torch.float16


def test_grpo_recipe_composes_to_a_consistent_config(tmp_path):
    script = ROOT / "integrations" / "verl" / "run_grpo.sh"
    text = script.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("exec python3"))
    args = [a for a in shlex.split(line)[4:] if a not in ("$OVERRIDES", "$@")]
    for name, value in {
        "MODEL": "/tmp/model",
        "DATA": str(tmp_path),
        "NGPUS": "8",
        "DTYPE": "float16",
    }.items():
        args = [a.replace(f"${name}", value) for a in args]
    cfg = compose_verl([*args, *overrides(**NO_VLLM)])
    assert check_config(cfg, PrecisionPolicy(strictness="error")) == []


def test_doctor_sees_verl_and_its_defaults():
    findings = doctor_findings(PrecisionPolicy())
    assert findings[0].details["version"] == str(VERL_VERSION)
    statuses = {f.status for f in findings}
    assert "change" in statuses  # verl's bf16 defaults contradict the float16 policy


_PROBE = """
import importlib.metadata as md, sys
import precision_plugin
print("FILE", precision_plugin.__file__)
eps = [ep.value for ep in md.entry_points(group="verl.plugins") if ep.name == "precision_plugin"]
print("EP", eps)
import verl
from verl.utils import config
from precision_plugin._base.patching import is_patched
print("LOADED", "precision_plugin.verl.plugin" in sys.modules)
print("WRAPPED", is_patched(config.omega_conf_to_dataclass))
from hydra import compose, initialize_config_dir
import os
d = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
with initialize_config_dir(config_dir=d, version_base=None):
    cfg = compose("ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.fsdp_config.dtype=float16"])
try:
    config.omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    print("RAISED no")
except Exception as exc:
    print("RAISED", type(exc).__name__, str(exc).replace(chr(10), " "))
"""


def test_entry_point_is_found_by_verls_own_loader(tmp_path):
    strict = '{"dtype":"float16","strictness":"error"}'
    on = run_installed(_PROBE, tmp_path, PRECISION_PLUGIN=strict)
    assert on["EP"] == "['precision_plugin.verl.plugin']"
    if VERL_VERSION.release < (0, 9):  # no verl.plugins loader: VERL_USE_EXTERNAL_MODULES
        assert on["LOADED"] == "False" and on["WRAPPED"] == "False"
        on = run_installed(
            _PROBE,
            tmp_path,
            PRECISION_PLUGIN=strict,
            VERL_USE_EXTERNAL_MODULES="precision_plugin.verl.plugin",
        )
    assert on["LOADED"] == "True" and on["WRAPPED"] == "True"
    if LEGACY:  # fsdp_config.dtype is what the legacy actor reads: nothing to refuse
        assert on["RAISED"] == "no"
    else:
        assert on["RAISED"].startswith("PrecisionMismatchError")
        assert "actor_rollout_ref.actor.fsdp_config.dtype" in on["RAISED"]


def test_without_the_env_var_the_plugin_changes_nothing(tmp_path):
    off = run_installed(_PROBE, tmp_path, VERL_USE_EXTERNAL_MODULES="precision_plugin.verl.plugin")
    assert off["LOADED"] == "True" and off["WRAPPED"] == "False"
    assert off["RAISED"] == "no"


# -- FSDP-Turbo (verl >= 0.9.1): its engine ignores the float16 setting ---------------------------
needs_turbo = pytest.mark.skipif(
    VERL_VERSION.release < (0, 9, 1), reason="the FSDP-Turbo engine exists from verl 0.9.1"
)


ENGINE_DIR = Path(verl.__file__).parent / "workers" / "engine" / "fsdp"


def _classes(filename: str) -> dict[str, ast.ClassDef]:
    """The classes of one file of the installed verl's FSDP engine, by name (read, not imported:
    importing the engine needs peft, datasets and more of verl's training stack)."""
    tree = ast.parse((ENGINE_DIR / filename).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _assigned(function: ast.FunctionDef) -> set[str]:
    """The ``self.<name>`` attributes ``function`` assigns."""
    return {
        target.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and getattr(target.value, "id", None) == "self"
    }


@needs_turbo
def test_fsdp_turbo_engine_never_sets_the_autocast_dtype_or_the_scaler():
    base = _classes("transformer_impl.py")
    turbo = _classes("fsdp_turbo_impl.py")["FSDPTurboEngineWithLMHead"]
    # registered as verl's engine for strategy fsdp_turbo, on top of the FSDP engine
    decorators = [ast.unparse(d) for d in turbo.decorator_list]
    assert any("backend='fsdp_turbo'" in d for d in decorators), decorators
    assert [ast.unparse(b) for b in turbo.bases] == ["FSDPEngineWithLMHead"]
    assert base["FSDPEngineWithLMHead"].bases[0].id == "FSDPEngine"
    fsdp = base["FSDPEngine"]
    # FSDPEngine.__init__ defaults to bf16 autocast and no scaler ...
    init = ast.unparse(_method(fsdp, "__init__"))
    assert "self._autocast_dtype = torch.bfloat16" in init and "self.scaler = None" in init
    # ... and its _build_fsdp_module sets both from mixed_precision (fp16 -> ShardedGradScaler)
    build = _method(fsdp, "_build_fsdp_module")
    assert {"_autocast_dtype", "scaler"} <= _assigned(build)
    assert "ShardedGradScaler" in ast.unparse(build)
    assert _method(base["FSDPEngineWithLMHead"], "_build_fsdp_module") is None
    # FSDP-Turbo replaces that method, sets neither, and never calls the original
    replaced = _method(turbo, "_build_fsdp_module")
    assert replaced is not None
    assert not {"_autocast_dtype", "scaler"} & _assigned(replaced)
    assert "super()._build_fsdp_module" not in ast.unparse(replaced)


@needs_turbo
def test_fsdp_turbo_with_every_float16_key_is_refused():
    turbo = [
        "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.fsdp_plan.param_dtype=fp16"
    ]
    cfg = compose_verl([*overrides("float16", **NO_VLLM), *turbo], "fsdp_turbo")
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # verl accepts it: the engine gets strategy fsdp_turbo and the float16 keys it will ignore
    assert actor.fsdp_config.strategy == "fsdp_turbo"
    assert actor.fsdp_config.mixed_precision["param_dtype"] == "fp16"
    with pytest.raises(PrecisionMismatchError) as err:
        check_config(cfg, PrecisionPolicy(strictness="error"))
    assert "[actor_rollout_ref.actor.strategy]" in str(err.value)
    assert "autocasts in bfloat16 with no loss scaler" in str(err.value)


@needs_turbo
def test_fsdp_turbo_bfloat16_overrides_compose_and_check_clean():
    cfg = compose_verl(overrides("bfloat16", strategy="fsdp_turbo", **NO_VLLM), "fsdp_turbo")
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.fsdp_config.turbo_config["distributed"]["fsdp_plan"]["param_dtype"] == "bf16"
    assert rollout_dtype(cfg) == torch.bfloat16
    assert check_config(cfg, PrecisionPolicy(dtype="bfloat16", strictness="error")) == []
