"""FP16 overflow safety on a real tiny Llama: headroom, runtime detection, float32 fallback."""

from __future__ import annotations

import copy
import json
import logging
import math
import re

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin._core.overflow import (
    FP16_MAX,
    OverflowDetector,
    fp16_margin_bits,
    headroom,
    keep_fp32_modules,
    match_modules,
)
from precision_plugin._core.overflow.fallback import is_fp32
from precision_plugin._core.scaler import make_grad_scaler
from precision_plugin.errors import ForwardOverflowError, PrecisionPluginError
from tests.tiny import OVERFLOW_MODULE, overflowing_llama, sample_ids, tiny_llama

HOT = OVERFLOW_MODULE


def _ids(seed: int = 1) -> torch.Tensor:
    return sample_ids(seed)


def _healthy() -> torch.nn.Module:
    return tiny_llama(num_hidden_layers=2)


def _overflowing(target: float = 1e6) -> torch.nn.Module:
    return overflowing_llama(target)


def _fp16_step(model, optimizer, scaler, ids) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# -- headroom ------------------------------------------------------------------------------------
def test_healthy_model_is_all_clear_with_margins():
    model = _healthy()
    report = headroom(model, [_ids(1), {"input_ids": _ids(2)}], margin_bits=3)
    names = dict(model.named_modules())
    assert report.ok and report.flagged == [] and report.batches == 2
    assert {m.path for m in report.modules} <= set(names)
    assert all(m.module_class == type(names[m.path]).__name__ for m in report.modules)
    for row in report.modules:
        assert math.isfinite(row.max_abs) and row.max_abs > 0
        assert row.margin_bits == pytest.approx(math.log2(FP16_MAX / row.max_abs))
        assert row.margin_bits >= 3
    assert report.min_margin_bits == report.tightest(1)[0].margin_bits
    assert report.recommendation().action == "none"
    data = json.loads(json.dumps(report.to_dict(top=5)))
    assert data["ok"] is True and len(data["modules"]) == 5


def test_maxima_are_the_maximum_over_every_batch():
    """Each module's figures are the maximum over the batches, equal to the largest of the
    batches measured one at a time (not the last batch's, not the first's)."""
    model = _healthy()
    batches = [_ids(1), _ids(2), _ids(3)]
    alone = [{m.path: m for m in headroom(model, b, margin_bits=3).modules} for b in batches]
    combined = headroom(model, batches, margin_bits=3)
    assert combined.batches == 3
    assert {m.path for m in combined.modules} == set(alone[0])
    for row in combined.modules:
        assert row.max_abs == max(a[row.path].max_abs for a in alone), row.path
        assert row.max_input_abs == max(a[row.path].max_input_abs for a in alone), row.path
    # the batches disagree on where the maxima are: keeping any one batch's would fail above
    for one in alone:
        assert any(one[m.path].max_abs < m.max_abs for m in combined.modules)


def test_headroom_flags_exactly_the_overflowing_layer():
    model = _overflowing()
    report = headroom(model, _ids(), margin_bits=3)
    flagged = [m.path for m in report.flagged]
    assert HOT in flagged
    assert all(p == "model.layers.1" or p.startswith("model.layers.1.") for p in flagged), flagged
    assert report.tightest(1)[0].margin_bits < 0  # does not fit float16 at all
    rec = report.recommendation()  # beyond the range: a float16 rollout overflows there too
    assert rec.action == "bfloat16" and rec.modules == (HOT,)
    assert f"keep_fp32_modules=[{HOT!r}]" in rec.message
    # The premise holds: the same model in fp16 autocast really produces a non-finite output.
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        out = model.get_submodule("model.layers.1.mlp")(torch.randn(1, 4, 32))
    assert not torch.isfinite(out).all()


def test_recommendation_names_the_source_not_the_layers_carrying_it_on():
    model = overflowing_llama(layers=3)  # layer 2 carries layer 1's values on the residual stream
    report = headroom(model, _ids(), margin_bits=3)
    assert "model.layers.2" in [m.path for m in report.flagged]
    carrier = next(m for m in report.modules if m.path == "model.layers.2")
    assert carrier.max_input_abs > FP16_MAX  # fed by values already beyond the range
    rec = report.recommendation()
    assert rec.modules == (HOT,)
    keep_fp32_modules(model, rec.modules)  # and following it is enough for a finite fp16 run
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert torch.isfinite(model(input_ids=_ids()).logits).all()


def test_margin_threshold_decides_the_flag():
    model = _overflowing(target=FP16_MAX / 2**2)  # 2 bits of headroom: fits, but close
    report = headroom(model, _ids(), margin_bits=3)
    assert HOT in [m.path for m in report.flagged]
    assert report.overflowing == []
    rec = report.recommendation()
    assert rec.action == "keep_fp32_modules" and rec.modules == (HOT,)
    assert headroom(model, _ids(), margin_bits=1).ok


def test_headroom_measures_in_float32_and_puts_the_model_back():
    model = _overflowing().half()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = headroom(model, _ids(), margin_bits=3)
    hot = next(m for m in report.modules if m.path == HOT)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(hot.max_abs) and hot.max_abs > FP16_MAX  # float32, not inf
    assert model.training
    after = model.state_dict()
    assert all(
        after[k].dtype == torch.float16 and torch.equal(after[k], v) for k, v in before.items()
    )


def test_headroom_margin_defaults_to_the_policy():
    policy = PrecisionPolicy(overflow={"margin_bits": 15})
    assert not headroom(_healthy(), _ids(), policy=policy).ok
    assert headroom(_healthy(), _ids(), policy=policy).margin_bits == 15


# -- runtime detection ---------------------------------------------------------------------------
def test_detection_raises_naming_the_first_overflowing_module():
    model = _overflowing()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = make_grad_scaler(PrecisionPolicy(), "cpu")
    detector = OverflowDetector.from_policy(
        model, PrecisionPolicy(strictness="error", overflow={"detect": "always"})
    )
    with pytest.raises(ForwardOverflowError) as info, detector.step(7):
        _fp16_step(model, optimizer, scaler, _ids())
    err = info.value
    assert isinstance(err, PrecisionPluginError)
    assert (err.module, err.module_class, err.step) == (HOT, "Linear", 7)
    assert math.isfinite(err.input_max) and 0 < err.input_max < FP16_MAX
    assert HOT in str(err) and "keep_fp32_modules" in str(err) and "bfloat16" in str(err)
    assert not detector.active  # hooks gone after the error
    assert all(not m._forward_hooks for m in model.modules())


def test_sampled_detection_warns_once_per_checked_step(caplog):
    model = _overflowing()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = make_grad_scaler(PrecisionPolicy(), "cpu")
    detector = OverflowDetector(model, mode="sampled", every=5, strictness="warn")
    seen = {}
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        for step in range(7):
            with detector.step(step) as checked:
                hooked = sum(len(m._forward_hooks) for m in model.modules())
                _fp16_step(model, optimizer, scaler, _ids())
                _fp16_step(model, optimizer, scaler, _ids())  # two forwards, one report
            seen[step] = (checked, hooked)
    assert {s for s, (checked, _) in seen.items() if checked} == {0, 5}
    assert all((hooked > 0) == checked for checked, hooked in seen.values())
    assert [(e.step, e.module) for e in detector.events] == [(0, HOT), (5, HOT)]
    overflow_logs = [r for r in caplog.records if "forward overflow" in r.getMessage()]
    assert len(overflow_logs) == 2 and HOT in overflow_logs[0].getMessage()


def test_detection_on_a_healthy_model_finds_nothing_and_a_one_off_check():
    model = _healthy()
    detector = OverflowDetector(model, mode="off")
    assert not detector.begin_step(0)
    detector.end_step()
    detector.check_next_step()
    assert detector.begin_step(1)
    with torch.autocast("cpu", dtype=torch.float16):
        model(input_ids=_ids(), labels=_ids())
    assert detector.end_step() is None
    assert detector.last_checked == (1, None) and detector.events == []
    assert not detector.begin_step(2)  # the one-off check is used up


def test_detector_refuses_an_unknown_mode():
    with pytest.raises(PrecisionConfigError, match="argument 'mode' got 'sometimes'"):
        OverflowDetector(_healthy(), mode="sometimes")


# -- float32 fallback ----------------------------------------------------------------------------
def test_keep_fp32_modules_lets_fp16_training_proceed_with_finite_loss():
    model = _overflowing()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = make_grad_scaler(PrecisionPolicy(), "cpu")
    detector = OverflowDetector(model, mode="always", strictness="error")
    fallback = keep_fp32_modules(model, ["model.layers.1.mlp.down_*"])
    assert fallback.modules == [HOT]
    losses = []
    for step in range(4):
        with detector.step(step):
            losses.append(_fp16_step(model, optimizer, scaler, _ids(step)))
    assert all(torch.isfinite(loss) for loss in losses)
    assert scaler.precision_stats().skipped_steps < 4  # the optimizer really stepped
    fallback.remove()
    assert not is_fp32(model.get_submodule(HOT))
    assert "forward" not in vars(model.get_submodule(HOT))


def test_fallback_output_stays_float32_and_params_are_cast_back():
    model = _overflowing().half()
    hot = model.get_submodule(HOT)
    fallback = keep_fp32_modules(model, [HOT])
    assert hot.weight.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):
        out = hot(torch.randn(1, 3, 64, dtype=torch.float16))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert keep_fp32_modules(model, [HOT]).modules == []  # already applied: wrapped once
    fallback.remove()
    assert hot.weight.dtype == torch.float16


def test_fallback_survives_deepcopy_with_its_own_weights():
    model = _healthy()
    keep_fp32_modules(model, ["model.layers.0.mlp"])
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.get_submodule("model.layers.0.mlp.down_proj").weight.zero_()
    x = torch.randn(1, 3, 32)
    assert is_fp32(clone.get_submodule("model.layers.0.mlp"))
    assert torch.count_nonzero(clone.get_submodule("model.layers.0.mlp")(x)) == 0
    assert torch.count_nonzero(model.get_submodule("model.layers.0.mlp")(x)) > 0


def test_match_modules_outermost_only_and_unknown_patterns_refused():
    model = _healthy()
    assert match_modules(model, ["model.layers.1.mlp", "model.layers.1.mlp.*"]) == [
        "model.layers.1.mlp"
    ]
    assert match_modules(model, ["model.layers.*.mlp.down_proj"]) == [
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.down_proj",
    ]
    with pytest.raises(PrecisionConfigError, match=re.escape("'layers.1.mlp' matches no module")):
        match_modules(model, ["layers.1.mlp"])


# -- policy --------------------------------------------------------------------------------------
def test_policy_overflow_section_round_trips_and_validates():
    policy = PrecisionPolicy.from_dict(
        {"overflow": {"keep_fp32_modules": ["a.*", " b "], "detect": "sampled"}}
    )
    assert policy.overflow.keep_fp32_modules == ("a.*", "b")
    assert PrecisionPolicy.from_env({"PRECISION_PLUGIN": policy.to_json()}) == policy
    bad = [
        ({"keep_fp32_modules": "model.norm"}, "expected a list of strings"),
        ({"keep_fp32_modules": ["ok", ""]}, "non-empty string"),
        ({"detect": "sometimes"}, "overflow.detect"),
        ({"detect_every": 0}, "overflow.detect_every"),
        ({"diagnose_after_skips": -1}, "overflow.diagnose_after_skips"),
        ({"margin_bits": float("inf")}, "overflow.margin_bits"),
        ({"detect_evry": 5}, "Did you mean 'overflow.detect_every'"),
    ]
    for section, message in bad:
        with pytest.raises(PrecisionConfigError, match=re.escape(message)):
            PrecisionPolicy.from_dict({"overflow": section})


@pytest.mark.parametrize(
    ("batch", "raised"),
    [
        (
            torch.ones(1, 4, dtype=torch.long),
            "RuntimeError: mat1 and mat2 must have the same dtype",
        ),
        (torch.ones(1, 7), "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x7 and 4x4)"),
        ({"input_ids": torch.ones(1, 4)}, "TypeError: Sequential.forward() got an unexpected"),
    ],
)
def test_a_batch_the_model_refuses_is_the_batches_error_and_leaves_no_hook(batch, raised):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with pytest.raises(PrecisionConfigError) as info:
        headroom(model, [torch.ones(1, 4), batch])
    text = str(info.value)
    assert text.startswith(
        "headroom(): argument 'batches': the model's forward failed on batch 1 ("
    )
    assert raised in text and "\n" not in text
    assert text.endswith(
        "pass what the model takes: a tensor of input ids (model(ids)) or a dict of its keyword "
        "arguments (model(**batch))."
    )
    assert isinstance(info.value.__cause__, (RuntimeError, TypeError))  # kept for a traceback
    assert all(not m._forward_hooks for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters()) and model.training


def test_fp16_margin_bits_refuses_a_negative_magnitude():
    with pytest.raises(PrecisionConfigError, match=r"argument 'max_abs' got -1\.0, which is neg"):
        fp16_margin_bits(-1.0)
    assert fp16_margin_bits(math.nan) == -math.inf and fp16_margin_bits(0.0) == math.inf
