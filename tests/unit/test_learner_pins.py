"""Pins for learner-side lines a mutation pass found unpinned: the loss scaler's telemetry and
checkpoint checks, master-weight planning, the overflow tensor helpers, the float32 fallback and
the dtype vocabulary. Expected values are worked out by hand in each test."""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin._base.dtypes import (
    SHORT_NAMES,
    canonical_dtype_name,
    dtype_label,
    normalize_dtype,
    same_dtype,
    spellings,
)
from precision_plugin._core.master_weights import check_model, prepare_model
from precision_plugin._core.overflow import keep_fp32_modules, match_modules
from precision_plugin._core.overflow.tensors import abs_max
from precision_plugin._core.scaler import STATE_KEY, ScalerStats, make_grad_scaler

# -- scaler -------------------------------------------------------------------------------------


def _scaler_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def _step(model, opt, scaler, *, poison: float | None = None) -> None:
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.ones(2, 4)).float().pow(2).mean()
    scaler.scale(loss).backward()
    if poison is not None:
        model.weight.grad.view(-1)[0] = poison
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def test_as_metrics_maps_each_counter_to_its_own_name():
    """Catches as_metrics reporting consecutive_skips (or another field) as skipped_steps."""
    stats = ScalerStats(scale=8.0, steps=9, skipped_steps=5, consecutive_skips=2, overflow_count=7)
    assert stats.as_metrics() == {
        "loss_scale": 8.0,
        "skipped_steps": 5.0,
        "consecutive_skips": 2.0,
        "overflow_count": 7.0,
    }


def test_torch_overflow_count_counts_overflows_not_steps():
    """Catches precision_stats() filling overflow_count from the step count."""
    model = _scaler_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = make_grad_scaler(PrecisionPolicy(loss_scaler={"init_scale": 256.0}), "cpu")
    for poison in (None, math.inf, None):
        _step(model, opt, scaler, poison=poison)
    stats = scaler.precision_stats()
    # 3 steps, 1 overflow (256 -> 128), the last step clean.
    assert (stats.steps, stats.skipped_steps, stats.overflow_count, stats.consecutive_skips) == (
        3,
        1,
        1,
        0,
    )
    assert stats.scale == 128.0


def test_disabled_scaler_reports_scale_one():
    """Catches a disabled scaler's precision_stats() reporting a scale other than 1.0."""
    scaler = make_grad_scaler(PrecisionPolicy(dtype="bfloat16"), "cpu")
    assert not scaler.is_enabled()
    assert scaler.precision_stats().scale == 1.0


def test_zero_counters_load_without_a_warning(caplog):
    """Catches load_state_dict treating a counter of 0 as damaged (value > 0 instead of >= 0)."""
    policy = PrecisionPolicy(loss_scaler={"init_scale": 64.0})
    model = _scaler_model()
    scaler = make_grad_scaler(policy, "cpu")
    _step(model, torch.optim.SGD(model.parameters(), lr=0.0), scaler)
    state = scaler.state_dict()
    assert state[STATE_KEY] == {"steps": 1, "skipped_steps": 0, "consecutive_skips": 0}
    restored = make_grad_scaler(policy, "cpu")
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        restored.load_state_dict(state)
    assert "restarts at 0" not in caplog.text
    stats = restored.precision_stats()
    assert (stats.steps, stats.skipped_steps, stats.consecutive_skips) == (1, 0, 0)


@pytest.mark.parametrize(
    ("key", "value"),
    [("growth_factor", 1.0), ("backoff_factor", 1.0), ("growth_interval", 0)],
)
def test_checkpoint_boundary_values_are_refused(key, value):
    """Catches the checkpoint check accepting growth_factor 1, backoff_factor 1 or
    growth_interval 0 (a scaler that never grows or never backs off)."""
    policy = PrecisionPolicy()
    state = make_grad_scaler(policy, "cpu").state_dict()
    state[key] = value
    restored = make_grad_scaler(policy, "cpu")
    with pytest.raises(PrecisionConfigError, match=f"checkpoint '{key}' is"):
        restored.load_state_dict(state)
    assert restored.get_scale() == 2.0**16  # nothing loaded


def test_policy_growth_and_backoff_factors_drive_the_scale():
    """Catches the policy's growth_factor/backoff_factor/growth_interval not reaching torch
    (e.g. torch's defaults 2.0/0.5 used instead)."""
    policy = PrecisionPolicy(
        loss_scaler={
            "init_scale": 8.0,
            "growth_factor": 4.0,
            "backoff_factor": 0.25,
            "growth_interval": 2,
        }
    )
    model = _scaler_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = make_grad_scaler(policy, "cpu")
    _step(model, opt, scaler)
    assert scaler.get_scale() == 8.0  # 1 clean step < growth_interval 2
    _step(model, opt, scaler)
    assert scaler.get_scale() == 32.0  # 2 clean steps: 8 * 4
    _step(model, opt, scaler, poison=math.inf)
    assert scaler.get_scale() == 8.0  # overflow: 32 * 0.25


def test_scale_is_clamped_to_the_policys_min_scale():
    """Catches the floor ignoring loss_scaler.min_scale (clamping to 1.0, or at_min_scale read
    against 1.0)."""
    policy = PrecisionPolicy(loss_scaler={"init_scale": 8.0, "min_scale": 4.0})
    model = _scaler_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = make_grad_scaler(policy, "cpu")
    _step(model, opt, scaler, poison=math.inf)  # 8 * 0.5 = 4: at the floor
    _step(model, opt, scaler, poison=math.inf)  # 4 * 0.5 = 2, clamped back to 4
    stats = scaler.precision_stats()
    assert (stats.scale, stats.at_min_scale, stats.consecutive_skips) == (4.0, True, 2)


# -- master weights -----------------------------------------------------------------------------


def _frozen_half(**children: torch.nn.Module) -> torch.nn.Module:
    model = torch.nn.Module()
    for name, child in children.items():
        setattr(model, name, child)
    return model.requires_grad_(False).half()


def test_keep_in_fp32_pattern_matches_whole_path_components():
    """Catches the keep-in-fp32 regex matching substrings ('head' would catch 'lm_head')."""
    model = _frozen_half(head=torch.nn.Linear(2, 2), lm_head=torch.nn.Linear(2, 2))
    model._keep_in_fp32_modules = ["head"]
    prepare_model(model, PrecisionPolicy())
    assert model.head.weight.dtype == torch.float32
    assert model.lm_head.weight.dtype == torch.float16


def test_keep_in_fp32_on_a_submodule_uses_the_full_parameter_path():
    """Catches keep-in-fp32 names losing the submodule's prefix (a wrapped model's declaration
    would then match nothing)."""
    inner = _frozen_half(head=torch.nn.Linear(2, 2), body=torch.nn.Linear(2, 2))
    inner._keep_in_fp32_modules = ["head"]
    wrapper = torch.nn.Module()
    wrapper.inner = inner
    prepare_model(wrapper, PrecisionPolicy())
    assert wrapper.inner.head.weight.dtype == torch.float32
    assert wrapper.inner.body.weight.dtype == torch.float16


def test_an_empty_keep_in_fp32_name_keeps_nothing_in_float32():
    """An empty entry names no module (transformers' own pattern never matches it); it built an
    empty regex, which matched every parameter: the whole model was kept in float32."""
    model = _frozen_half(a=torch.nn.Linear(2, 2), b=torch.nn.Linear(2, 2))
    model._keep_in_fp32_modules = [""]
    prepare_model(model, PrecisionPolicy())
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    model = _frozen_half(a=torch.nn.Linear(2, 2), b=torch.nn.Linear(2, 2))
    model._keep_in_fp32_modules = ["", "a"]
    prepare_model(model, PrecisionPolicy())
    assert (model.a.weight.dtype, model.b.weight.dtype) == (torch.float32, torch.float16)


def test_float32_policy_leaves_frozen_half_weights_alone():
    """Catches frozen fp16 weights being cast to the policy dtype under a float32 policy."""
    model = _frozen_half(base=torch.nn.Linear(2, 2))
    assert [f.status for f in check_model(model, PrecisionPolicy(dtype="float32"))] == ["ok"]


def test_non_floating_parameter_in_a_keep_in_fp32_module_is_not_cast():
    """Catches quantized (integer) storage in a keep-in-fp32 module being cast to float32."""
    model = torch.nn.Module()
    model.head = torch.nn.Module()
    model.head.qweight = torch.nn.Parameter(torch.zeros(2, dtype=torch.int8), requires_grad=False)
    model._keep_in_fp32_modules = ["head"]
    assert [f.status for f in check_model(model, PrecisionPolicy())] == ["ok"]
    prepare_model(model, PrecisionPolicy())
    assert model.head.qweight.dtype == torch.int8


def _trainable_half(n: int) -> torch.nn.Module:
    model = torch.nn.Module()
    for i in range(n):
        model.register_parameter(f"p{i}", torch.nn.Parameter(torch.zeros(1, dtype=torch.float16)))
    return model


@pytest.mark.parametrize(
    ("n", "listed"),
    [(3, "(p0, p1, p2): "), (4, "(p0, p1, p2 and 1 more): ")],
)
def test_cast_message_names_three_parameters_then_counts_the_rest(n, listed):
    """Catches the message quoting a number of names other than 3, or adding 'and 0 more'."""
    (finding,) = check_model(_trainable_half(n), PrecisionPolicy())
    assert finding.message.startswith(f"{n} parameter(s) float16 -> float32 {listed}")
    assert finding.details["parameters"] == [f"p{i}" for i in range(n)]


def test_frozen_fp16_under_bf16_policy_gets_the_dtype_fix_not_the_fp32_one():
    """Catches _fix_text giving the 'load in float32' advice to any fp16 parameter (or for and)."""
    model = _frozen_half(base=torch.nn.Linear(2, 2))
    (finding,) = check_model(model, PrecisionPolicy(dtype="bfloat16"))
    assert (finding.details["from"], finding.details["to"]) == ("float16", "bfloat16")
    assert finding.fix == "load the model with dtype=torch.bfloat16, or call prepare_model(model)"


# -- overflow tensors ---------------------------------------------------------------------------


def test_abs_max_is_a_magnitude():
    """Catches abs_max dropping the abs() (a large negative value would be missed)."""
    assert abs_max(torch.tensor([-5.0, 2.0])).item() == 5.0


def test_abs_max_is_the_maximum_over_every_tensor_not_the_first():
    """Catches abs_max returning the first tensor's maximum when there are several."""
    assert abs_max((torch.tensor([2.0]), torch.tensor([-7.0]))).item() == 7.0


def test_abs_max_ignores_integer_tensors():
    """Catches floating_tensors yielding integer tensors (token ids are not activations)."""
    assert abs_max((torch.tensor([1.5]), torch.tensor([100]))).item() == 1.5


def test_abs_max_skips_empty_tensors():
    """Catches abs_max reducing an empty tensor (amax of nothing raises)."""
    assert abs_max([torch.empty(0), torch.tensor([0.5])]).item() == 0.5
    assert abs_max(torch.empty(0)) is None


def test_abs_max_walks_dicts_and_lists():
    """Catches floating_tensors skipping mappings or lists."""
    assert abs_max({"hidden": torch.tensor([3.0])}).item() == 3.0
    assert abs_max([torch.tensor([1.0]), [torch.tensor([-4.0])]]).item() == 4.0


# -- float32 fallback ---------------------------------------------------------------------------


def _identity_linear(dtype: torch.dtype = torch.float32) -> torch.nn.Linear:
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.zero_()
    return lin.to(dtype)


def test_unknown_pattern_message_gives_three_example_paths():
    """Catches the 'matches no module' message quoting fewer than three example paths."""
    model = torch.nn.Sequential(*(torch.nn.ReLU() for _ in range(4)))
    with pytest.raises(PrecisionConfigError) as raised:
        match_modules(model, ["nope"])
    assert "e.g. '0', '1', '2'; use fnmatch" in str(raised.value)


def test_bf16_parameters_and_fp16_buffers_run_in_float32_and_come_back():
    """Catches the fallback casting only fp16 parameters (bf16 ones and buffers left low)."""
    lin = _identity_linear(torch.bfloat16)
    lin.register_buffer("gain", torch.ones(2, dtype=torch.float16))
    model = torch.nn.Sequential(lin)
    fallback = keep_fp32_modules(model, ["0"])
    try:
        assert lin.weight.dtype == torch.float32
        assert lin.gain.dtype == torch.float32
    finally:
        fallback.remove()
    assert lin.weight.dtype == torch.bfloat16
    assert lin.gain.dtype == torch.float16


def test_bf16_input_is_cast_to_float32():
    """Catches _to_fp32 casting only fp16 inputs (a bf16 input meets fp32 weights and fails)."""
    model = torch.nn.Sequential(_identity_linear())
    fallback = keep_fp32_modules(model, ["0"])
    try:
        out = model[0](torch.tensor([[1.0, -2.0]], dtype=torch.bfloat16))
    finally:
        fallback.remove()
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.0, -2.0]]


class _Echo(torch.nn.Module):
    def forward(self, *args, **kwargs):
        return args, kwargs


def test_keyword_and_dict_inputs_are_cast_to_float32():
    """Catches _to_fp32 leaving dicts (and so **kwargs) uncast."""
    model = torch.nn.Sequential(_Echo())
    fallback = keep_fp32_modules(model, ["0"])
    try:
        args, kwargs = model[0]({"h": torch.ones(1, dtype=torch.float16)}, x=torch.ones(1).half())
    finally:
        fallback.remove()
    assert args[0]["h"].dtype == torch.float32
    assert kwargs["x"].dtype == torch.float32


class _Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


def test_named_tuple_input_is_passed_through():
    """Catches _to_fp32 rebuilding a namedtuple from a generator (TypeError)."""
    model = torch.nn.Sequential(_Echo())
    fallback = keep_fp32_modules(model, ["0"])
    pair = _Pair(torch.ones(1, dtype=torch.float16), torch.zeros(1, dtype=torch.float16))
    try:
        args, _ = model[0](pair)
    finally:
        fallback.remove()
    assert args[0] is pair


def test_a_forward_the_module_already_had_still_runs():
    """Catches the fallback ignoring an instance-level forward (another library's wrapper)."""
    lin = _identity_linear()
    seen = []

    def own(x):
        seen.append(x.dtype)
        return x + 1

    lin.forward = own
    model = torch.nn.Sequential(lin)
    fallback = keep_fp32_modules(model, ["0"])
    try:
        out = lin(torch.tensor([1.0, 2.0], dtype=torch.float16))
    finally:
        fallback.remove()
    assert seen == [torch.float32]
    assert out.tolist() == [2.0, 3.0]
    assert vars(lin)["forward"] is own


# -- dtypes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("float16", "float16"),
        ("fp16", "float16"),
        ("half", "float16"),
        ("f16", "float16"),
        ("torch.float16", "float16"),
        ("torch.half", "float16"),
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("torch.bfloat16", "bfloat16"),
        ("float32", "float32"),
        ("fp32", "float32"),
        ("float", "float32"),
        ("f32", "float32"),
        ("torch.float32", "float32"),
        ("torch.float", "float32"),
    ],
)
def test_every_alias_names_its_precision(spelling, canonical):
    """Catches an alias mapped to the wrong precision (e.g. 'f16' or 'torch.half' to bf16)."""
    assert normalize_dtype(spelling) == canonical
    assert normalize_dtype(spelling.upper()) == canonical


def test_framework_only_spellings_are_not_policy_dtypes():
    """Catches normalize_dtype accepting verl's '16'/'32' (only canonical_dtype_name reads them)."""
    assert canonical_dtype_name("16") == "float16"
    assert canonical_dtype_name("32") == "float32"
    for spelling in ("16", "32"):
        with pytest.raises(PrecisionConfigError, match="is not a supported precision"):
            normalize_dtype(spelling)


def test_short_names():
    """Catches a wrong short spelling (bf16 is what Accelerate and DeepSpeed read)."""
    assert SHORT_NAMES == {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def test_spellings_adds_the_extra_entries():
    """Catches spellings() dropping ``extra`` (e.g. a framework's 'auto')."""
    assert spellings(["fp16", "bf16"], {"auto": None}) == {
        "fp16": "float16",
        "bf16": "bfloat16",
        "auto": None,
    }


def test_none_has_an_empty_label():
    """Catches None being labelled 'none' (then same_dtype(None, 'none') would be true)."""
    assert dtype_label(None) == ""
    assert not same_dtype(None, "none")
