"""One advice decision per probe: overflow, then headroom, then consequence with its interval,
then the mismatch; applied in the three ways the plugin is configured."""

from __future__ import annotations

import json

import pytest

from precision_plugin._core.decision import (
    Attribution,
    Evidence,
    Headroom,
    apply_forms,
    decide,
    prompts_to_decide,
)
from precision_plugin._core.intervals import Interval
from precision_plugin._core.manager import coerce_policy
from precision_plugin.deepspeed import config_policy
from precision_plugin.policy import PrecisionPolicy

MODULES = ("model.layers.3.mlp.down_proj", "model.layers.29.mlp.down_proj")
#: SmolLM2's probe: 22 modules within the margin, two places where it starts.
SMOLLM2 = Headroom("keep_fp32_modules", MODULES, 22, 3.0, "22 module(s) come within 2^3 ...")


def _ev(dtype, kept, k3=(1e-5, 0.9e-5, 1.1e-5), n=16, verdict="noticeable", blocked=""):
    return Evidence(dtype, Interval(*kept), Interval(*k3), n, verdict, blocked)


FP16 = _ev("float16", (0.78, 0.6, 0.9))
BF16 = _ev("bfloat16", (0.004, 0.001, 0.02), k3=(6e-4, 5e-4, 7e-4), verdict="severe")


def test_headroom_near_the_maximum_makes_float16_carry_keep_fp32_modules():
    d = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256, headroom=SMOLLM2)
    assert (d.action, d.dtype, d.decided_by) == ("train", "float16", "consequence")
    assert d.keep_fp32_modules == MODULES
    assert "22 module(s) within 3 bits of float16's maximum" in d.line
    for form in d.forms.values():
        assert form in d.line
    assert d.line.count("do: ") == 1


def test_each_printed_form_parses_to_the_same_policy():
    forms = apply_forms("float16", MODULES)
    python = forms["python"]
    assert python == (
        "precision_plugin.enable(overflow={'keep_fp32_modules': "
        "['model.layers.3.mlp.down_proj', 'model.layers.29.mlp.down_proj']})"
    )
    kwargs = kwargs_of(python)
    assert kwargs["overflow"]["keep_fp32_modules"] == list(MODULES)
    from_python = coerce_policy(None, **kwargs)
    key, _, entry = forms["deepspeed"].partition(": ")
    assert key == '"precision_plugin"'
    from_ds = config_policy({"precision_plugin": json.loads(entry)})
    env = forms["env"].removeprefix("PRECISION_PLUGIN=").strip("'")
    from_env = PrecisionPolicy.from_env({"PRECISION_PLUGIN": env})
    for policy in (from_python, from_ds, from_env):
        assert policy.dtype == "float16" and policy.overflow.keep_fp32_modules == MODULES
    bf = apply_forms("bfloat16")
    assert bf == {
        "python": "precision_plugin.enable(dtype='bfloat16')",
        "deepspeed": '"precision_plugin": {"dtype": "bfloat16"}',
        "env": "PRECISION_PLUGIN=bfloat16",
    }


def kwargs_of(call: str) -> dict:
    """The keyword arguments of a printed ``precision_plugin.enable(...)`` call (literals)."""
    import ast

    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and ast.unparse(node.func) == "precision_plugin.enable"
    return {k.arg: ast.literal_eval(k.value) for k in node.keywords}


def test_an_overflowing_float16_is_never_either_dtype_works():
    negligible = (0.999, 0.995, 1.0)
    gone = _ev("float16", negligible, blocked="'model.layers.0.mlp' reaches 7e+04")
    bf16 = _ev("bfloat16", negligible, verdict="negligible")
    d = decide({"float16": gone, "bfloat16": bf16}, target=512, batch=256)
    assert (d.action, d.dtype, d.decided_by) == ("train", "bfloat16", "overflow")
    assert "either" not in d.line and "float16 is out: 'model.layers.0.mlp'" in d.line
    beyond = Headroom("bfloat16", ("model.layers.0.mlp",), 3, 3.0, "beyond float16's 65504")
    fp16 = _ev("float16", negligible, verdict="negligible")
    d = decide({"float16": fp16, "bfloat16": bf16}, target=512, batch=256, headroom=beyond)
    assert (d.dtype, d.decided_by) == ("bfloat16", "headroom") and "either" not in d.line


def test_overlapping_consequences_fall_to_the_mismatch_and_say_how_many_prompts_decide():
    a = _ev("float16", (0.6, 0.4, 0.8))
    b = _ev("bfloat16", (0.5, 0.3, 0.7), k3=(6e-4, 5e-4, 7e-4))
    d = decide({"float16": a, "bfloat16": b}, target=4096, batch=256)
    assert (d.dtype, d.decided_by) == ("float16", "mismatch")
    # Facing half-widths 0.2 + 0.2 over a gap of 0.1: (0.4 / 0.1)² = 16 times the 16 sequences,
    # plus 10 %: 282.
    assert d.num_prompts == prompts_to_decide((0.6, 0.4, 0.8), (0.5, 0.3, 0.7), 16) == 282
    assert "not enough sequences to decide on the consequence" in d.line
    assert "about --num-prompts 282 would decide it" in d.line
    same = _ev("bfloat16", (0.5, 0.3, 0.7))
    d = decide({"float16": a, "bfloat16": same}, target=4096, batch=256)
    assert (d.action, d.dtype, d.decided_by) == ("undecided", None, "none")
    assert d.line.startswith("do: not enough sequences to decide")


def test_a_failed_self_check_and_a_broken_model_come_first():
    d = decide({"float16": FP16}, target=4096, batch=256, valid=False, headroom=SMOLLM2)
    assert d.action == "fix_setup" and d.dtype is None and "apply:" not in d.line
    broken = Headroom("fix_model", ("m",), 1, 3.0, "'m' produces inf/NaN even in float32")
    d = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256, headroom=broken)
    assert d.action == "fix_model" and "inf/NaN even in float32" in d.line


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_single_dtype_is_advised_with_its_figures(dtype):
    e = _ev(dtype, (0.78, 0.6, 0.9))
    d = decide({dtype: e}, target=4096, batch=64)
    assert d.dtype == dtype and "a batch of 64 keeps 78% (60%–90%, 16 sequences)" in d.line


#: The embedded model's rollout attribution (docs/results/attribution-embedded-rollout.json):
#: an fp8 KV cache is 80 % of float16's mismatch, the dtype's own rounding 0.07 %.
KV = Attribution(
    "float16",
    "kv_cache",
    0.80,
    "kv_cache_dtype",
    {"--rollout": "kv_cache_dtype=auto", "vLLM": "--kv-cache-dtype auto"},
    0.0007,
)
#: The default rollout: bfloat16's rounding is all of its mismatch.
ROUNDING = Attribution("bfloat16", "dtype", 0.9996, "dtype", {"vLLM": "--dtype float16"}, 0.9996)


def test_without_an_attribution_the_decision_is_unchanged():
    both = {"float16": FP16, "bfloat16": BF16}
    plain = decide(both, target=4096, batch=256, headroom=SMOLLM2)
    assert decide(both, target=4096, batch=256, headroom=SMOLLM2, attribution=None) == plain
    assert plain.change_first == "" and "change" not in plain.line


def test_a_kv_cache_dominated_attribution_says_change_kv_cache_dtype_first():
    d = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256, attribution=KV)
    assert (d.action, d.dtype, d.decided_by, d.change_first) == (
        "train",
        "float16",
        "attribution",
        "kv_cache_dtype",
    )
    assert d.line.startswith(
        "do: change kv_cache_dtype first (80% of the float16 mismatch in this rollout, the "
        "dtype's own rounding <0.1%): --rollout kv_cache_dtype=auto · vLLM --kv-cache-dtype "
        "auto; then train in float16: at 4,096 tokens, a batch of 256 keeps 78% (60%–90%, 16 "
        "sequences)"
    )
    assert d.line.count("do: ") == 1 and d.to_dict()["change_first"] == "kv_cache_dtype"
    # Undecided on the dtype: the setting still comes first, the dtype stays open.
    a, same = _ev("float16", (0.6, 0.4, 0.8)), _ev("bfloat16", (0.5, 0.3, 0.7))
    d = decide({"float16": a, "bfloat16": same}, target=4096, batch=256, attribution=KV)
    assert (d.action, d.dtype, d.decided_by) == ("undecided", None, "attribution")
    assert d.line.startswith("do: change kv_cache_dtype first") and "; then not enough" in d.line


def test_a_dtype_dominated_attribution_keeps_the_dtype_advice():
    both = {"float16": FP16, "bfloat16": BF16}
    plain = decide(both, target=4096, batch=256)
    d = decide(both, target=4096, batch=256, attribution=ROUNDING)
    assert (d.action, d.dtype, d.decided_by, d.change_first) == (
        "train",
        "float16",
        "consequence",
        "",
    )
    assert d.line.startswith(plain.line.split(". apply:")[0])
    assert "the attribution agrees: the compute dtype's rounding is >99.9% of the bfloat16" in (
        d.line
    )
    # A setting smaller than the dtype's own rounding does not lead either.
    small = Attribution("float16", "kv_cache", 0.2, "kv_cache_dtype", {}, 0.7)
    d = decide(both, target=4096, batch=256, attribution=small)
    assert d == plain


def test_overflow_and_headroom_still_come_before_the_attribution():
    negligible = (0.999, 0.995, 1.0)
    gone = _ev("float16", negligible, blocked="'model.layers.0.mlp' reaches 7e+04")
    bf16 = _ev("bfloat16", negligible, verdict="negligible")
    d = decide({"float16": gone, "bfloat16": bf16}, target=512, batch=256, attribution=KV)
    assert (d.action, d.dtype, d.decided_by, d.change_first) == (
        "train",
        "bfloat16",
        "overflow",
        "kv_cache_dtype",
    )
    assert d.line.startswith("do: train in bfloat16: at 512 tokens")
    assert "float16 is out: 'model.layers.0.mlp'" in d.line
    assert "; then change kv_cache_dtype first" in d.line
    assert d.line.index("float16 is out") < d.line.index("then change kv_cache_dtype")
    # A dtype-dominated attribution never brings an overflowing float16 back.
    d = decide({"float16": gone, "bfloat16": bf16}, target=512, batch=256, attribution=ROUNDING)
    assert (d.dtype, d.decided_by) == ("bfloat16", "overflow") and "agrees" not in d.line
    beyond = Headroom("bfloat16", ("model.layers.0.mlp",), 3, 3.0, "beyond float16's 65504")
    fp16 = _ev("float16", negligible, verdict="negligible")
    d = decide(
        {"float16": fp16, "bfloat16": bf16}, target=512, batch=256, headroom=beyond, attribution=KV
    )
    assert (d.dtype, d.decided_by) == ("bfloat16", "headroom")
    assert d.line.startswith("do: train in bfloat16") and "then change kv_cache_dtype" in d.line
    # The self-check and a broken model come before everything, attribution included.
    d = decide({"float16": FP16}, target=4096, batch=256, valid=False, attribution=KV)
    assert (d.action, d.decided_by, d.change_first) == ("fix_setup", "self-check", "")


#: k3 intervals for the boundary cases: LOW's upper end is exactly TOUCH's lower end.
LOW, TOUCH, HIGH = (1e-5, 0.9e-5, 1.1e-5), (2e-5, 1.1e-5, 3e-5), (4e-5, 3.5e-5, 4.5e-5)


def test_either_dtype_works_names_the_lower_k3_and_its_factor_only_when_apart():
    """Both keep over 99 %: either works, by the consequence; the lower-k3 dtype is named, and
    its factor only when the k3 intervals are apart (touching ends are not apart)."""
    negligible = (0.995, 0.99, 1.0)
    fp16 = _ev("float16", negligible, k3=HIGH, verdict="negligible")
    bf16 = _ev("bfloat16", negligible, k3=LOW, verdict="negligible")
    d = decide({"float16": fp16, "bfloat16": bf16}, target=512, batch=64)
    assert (d.action, d.dtype, d.decided_by, d.num_prompts) == (
        "either",
        "bfloat16",
        "consequence",
        None,
    )
    assert d.line.startswith(
        "do: either dtype works: at 512 tokens, a batch of 64 keeps float16 99.5% (99%–100%, 16 "
        "sequences), bfloat16 99.5% (99%–100%, 16 sequences) (every consequence under 1 %); "
        "bfloat16's k3 is 4x lower. apply: "
    )
    touching = _ev("float16", negligible, k3=TOUCH, verdict="negligible")
    d = decide({"float16": touching, "bfloat16": bf16}, target=512, batch=64)
    assert (d.action, d.dtype) == ("either", "bfloat16")
    assert "k3 is" not in d.line and "(every consequence under 1 %). apply: " in d.line


def test_the_consequence_decides_for_either_dtype_but_not_on_touching_intervals():
    """Apart consequence intervals decide for the better dtype whichever is named first;
    intervals whose ends touch do not (the equal k3 then leaves it undecided)."""
    worse, better = (0.3, 0.2, 0.4), (0.7, 0.6, 0.8)
    for fp16, bf16, best in ((better, worse, "float16"), (worse, better, "bfloat16")):
        d = decide(
            {"float16": _ev("float16", fp16), "bfloat16": _ev("bfloat16", bf16)},
            target=4096,
            batch=256,
        )
        assert (d.action, d.dtype, d.decided_by) == ("train", best, "consequence")
        other = "bfloat16" if best == "float16" else "float16"
        assert d.line.startswith(
            f"do: train in {best}: at 4,096 tokens, a batch of 256 keeps 70% (60%–80%, 16 "
            f"sequences), {other} 30% (20%–40%, 16 sequences)"
        )
    touch = (0.5, 0.4, 0.6)  # its upper end is better's lower end
    for fp16, bf16 in ((better, touch), (touch, better)):
        d = decide(
            {"float16": _ev("float16", fp16), "bfloat16": _ev("bfloat16", bf16)},
            target=4096,
            batch=256,
        )
        assert (d.action, d.dtype, d.decided_by) == ("undecided", None, "none")


def test_the_mismatch_decides_for_either_dtype_but_not_on_touching_k3_intervals():
    """Overlapping consequences: apart k3 intervals decide for the lower one whichever dtype it
    is; touching ones do not."""
    kept = (0.6, 0.4, 0.8)
    for fp16_k3, bf16_k3, lower in ((LOW, HIGH, "float16"), (HIGH, LOW, "bfloat16")):
        d = decide(
            {"float16": _ev("float16", kept, fp16_k3), "bfloat16": _ev("bfloat16", kept, bf16_k3)},
            target=4096,
            batch=256,
        )
        assert (d.action, d.dtype, d.decided_by) == ("train", lower, "mismatch")
        assert d.line.startswith(
            f"do: train in {lower}: its mismatch is 4x lower (k3 1.0e-05 vs 4.0e-05); "
        )
    for fp16_k3, bf16_k3 in ((LOW, TOUCH), (TOUCH, LOW)):
        d = decide(
            {"float16": _ev("float16", kept, fp16_k3), "bfloat16": _ev("bfloat16", kept, bf16_k3)},
            target=4096,
            batch=256,
        )
        assert (d.action, d.dtype, d.decided_by) == ("undecided", None, "none")


KV_FIRST = Attribution(
    "float16", "kv_cache", 0.8, "kv_cache_dtype", {"--rollout": "kv_cache_dtype=auto"}
)


def test_with_the_rollout_as_configured_the_line_reads_change_now_then_what_that_leaves():
    """Issue 54: with --rollout the do: line said "keeps 78 %", true only after the fix. Now:
    what to change first, what the rollout keeps as configured, then the dtype with the rollout
    at its defaults."""
    from precision_plugin._core.decision import Configured

    now = _ev("float16", (0.0004, 0.0, 0.008), k3=(2e-2, 1e-2, 3e-2), verdict="severe")
    configured = Configured("kv_cache_dtype=fp8_e4m3", {"float16": now}, 4096, 256)
    d = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256, attribution=KV_FIRST,
               configured=configured)  # fmt: skip
    assert d.line.startswith(
        "do: change kv_cache_dtype first (80% of the float16 mismatch in this rollout, the "
        "dtype's own rounding 0%): --rollout kv_cache_dtype=auto; as configured "
        "(kv_cache_dtype=fp8_e4m3), float16 at 4,096 tokens keeps <0.1% (0%–0.8%, 16 "
        "sequences) of a batch of 256 (severe); then, with the rollout settings at their "
        "defaults, train in float16: at 4,096 tokens, a batch of 256 keeps 78% (60%–90%, 16 "
        "sequences), bfloat16 0.4% (0.1%–2.0%, 16 sequences)"
    ), d.line
    # a setting that does not outweigh the dtype: the dtype leads, the configured figure follows
    weak = Attribution("float16", "kv_cache", 0.1, "kv_cache_dtype", {}, dtype_share=0.9)
    d = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256, attribution=weak,
               configured=configured)  # fmt: skip
    assert d.line.startswith("do: train in float16: at 4,096 tokens, a batch of 256 keeps 78%")
    assert "; as configured (kv_cache_dtype=fp8_e4m3), float16 at 4,096 tokens keeps <0.1%" in (
        d.line
    )


def test_apply_says_where_deepspeed_on_this_machine_refuses_the_dtype():
    """Issue 54: the apply: line recommended a DeepSpeed fp16 section that doctor, on the same
    CPU, calls an error."""
    runs = {"float16": False, "bfloat16": True}
    d = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256, deepspeed_runs=runs)
    assert d.dtype == "float16"
    assert d.forms["deepspeed"] == (
        '"precision_plugin": {"dtype": "float16"} on a device whose DeepSpeed runs fp16 (this '
        "machine's DeepSpeed accelerator has no fp16, as precision-plugin doctor says; here: "
        '"precision_plugin": {"dtype": "bfloat16"} on both sides)'
    )
    assert d.forms["deepspeed"] in d.line
    assert d.forms["python"] == "precision_plugin.enable()"  # torch runs fp16 on any CPU
    fine = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256,
                  deepspeed_runs={"float16": True, "bfloat16": True})  # fmt: skip
    assert fine.forms["deepspeed"] == '"precision_plugin": {"dtype": "float16"}'
    nothing = {"float16": False, "bfloat16": False}
    none = decide({"float16": FP16, "bfloat16": BF16}, target=4096, batch=256,
                  deepspeed_runs=nothing)  # fmt: skip
    assert "; here:" not in none.forms["deepspeed"]
