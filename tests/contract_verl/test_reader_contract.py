"""The verl dialect of the strict config reader against verl's own composed config (Hydra).

verl's real ``ppo_trainer`` config, composed by Hydra with overrides, is read without any key
taken for a typo, and the reader's values are OmegaConf's; an override Hydra types as a string
where a switch belongs is refused by the reader.
"""

from __future__ import annotations

import pytest
from conftest import compose_verl
from omegaconf import OmegaConf

from precision_plugin._core.configs import VERL, parse_override
from precision_plugin._core.configs.reader import flatten
from precision_plugin.errors import PrecisionConfigError


@pytest.mark.parametrize("strategy", ["fsdp", "megatron"])
def test_verls_own_config_reads_clean(strategy):
    cfg = compose_verl(["actor_rollout_ref.rollout.dtype=float16"], strategy)
    read = VERL.read_mapping(cfg, "ppo_trainer.yaml")
    flat = flatten(OmegaConf.to_container(cfg, resolve=False))
    assert read == {k: flat[k] for k in read}
    assert read["actor_rollout_ref.rollout.dtype"] == "float16"


def test_no_key_of_verls_config_is_taken_for_a_typo():
    cfg = OmegaConf.to_container(compose_verl([]), resolve=False)
    flagged = {k: VERL.typo(k, list(VERL.by_path)) for k in flatten(cfg)}
    assert {k: near for k, near in flagged.items() if near} == {}


@pytest.mark.parametrize(
    ("override", "value"),
    [
        ("actor_rollout_ref.rollout.calculate_log_probs=false", False),
        ("actor_rollout_ref.rollout.calculate_log_probs=True", True),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", 2),
    ],
)
def test_overrides_are_typed_as_hydra_types_them(override, value):
    cfg = compose_verl([override])
    path = override.split("=")[0]
    assert OmegaConf.select(cfg, path) == value
    assert parse_override(override, VERL) == (path, value)


def test_a_quoted_boolean_is_a_string_to_hydra_and_refused_by_the_reader():
    cfg = compose_verl(["actor_rollout_ref.rollout.calculate_log_probs='false'"])
    assert OmegaConf.select(cfg, "actor_rollout_ref.rollout.calculate_log_probs") == "false"
    with pytest.raises(PrecisionConfigError, match="the string 'false'"):
        VERL.read_mapping(cfg, "ppo_trainer.yaml")


@pytest.mark.parametrize(
    "text",
    ["a: 1e-6\nb: 2001-01-01\nc: yes\nd: Off\ne: .inf\nf: '0'\n", "x: [1, 2.5, null, ~]\n"],
)
def test_the_loader_without_omegaconf_reads_yaml_as_omegaconf_does(text):
    import yaml
    from omegaconf._utils import get_yaml_loader

    from precision_plugin._core.configs.files import replica_loader

    assert yaml.load(text, Loader=replica_loader()) == yaml.load(text, Loader=get_yaml_loader())
    with pytest.raises(yaml.YAMLError):
        yaml.load("a: 1\na: 2\n", Loader=replica_loader())
