"""Properties of the whole public API, enumerated (never listed by hand): every public function,
class and public method is checked at the boundary, and wrong types, out-of-range values and
unknown arguments raise only ``PrecisionConfigError`` (one line, naming the parameter) and
change nothing (no policy, patch, tracked change, hook or environment variable left behind).

The public API is ``__all__`` of ``precision_plugin`` and of each of its subpackages, plus what
docs/api.md documents; a class brings its own public methods. A new public function is covered
by being public: ``test_every_public_entry_point_is_checked`` fails until it is ``@checked`` or
exempted below with a reason.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import precision_plugin
import precision_plugin._core.configs
from precision_plugin import PrecisionConfigError
from precision_plugin._base.boundary import Boundary, Validator, boundary_of
from precision_plugin._base.boundary.typecheck import _arms, _mismatch, _takes_policy
from precision_plugin._core.metrics.consequence import COUNT_FIELDS
from precision_plugin._core.metrics.mismatch import SUM_FIELDS
from precision_plugin._core.sampling import SamplingSettings
from tests.unit.state import assert_unchanged, model_untouched, snapshot

ROOT = Path(__file__).resolve().parents[2]

# -- enumerating the public API ------------------------------------------------------------------


def api_modules() -> list[str]:
    """``precision_plugin`` and every subpackage of it (those of the internal layer folders
    ``_base`` and ``_core`` included; the folders themselves export nothing)."""
    found = ["precision_plugin"]
    for m in pkgutil.iter_modules(precision_plugin.__path__):
        if not m.ispkg:
            continue
        if not m.name.startswith("_"):
            found.append(f"precision_plugin.{m.name}")
            continue
        folder = importlib.import_module(f"precision_plugin.{m.name}")
        found += [f"{folder.__name__}.{s.name}" for s in pkgutil.iter_modules(folder.__path__)
                  if s.ispkg]  # fmt: skip
    return found


def documented() -> dict[str, Any]:
    """Every object docs/api.md documents (``::: target`` with or without ``members``)."""
    text = (ROOT / "docs" / "api.md").read_text()
    found: dict[str, Any] = {}
    for match in re.finditer(r"^::: (\S+)((?:\n    .*)*)", text, re.M):
        target, options = match.group(1), match.group(2)
        members = re.search(r"members: \[(.*?)\]", options)
        try:
            module = importlib.import_module(target)
        except ImportError:
            owner, _, attr = target.rpartition(".")
            found[target] = getattr(importlib.import_module(owner), attr)
            continue
        if members:
            names = [n.strip() for n in members.group(1).split(",")]
        else:  # a whole module: what it defines itself (mkdocstrings leaves out imports)
            names = [
                n
                for n, obj in vars(module).items()
                if not n.startswith("_") and getattr(obj, "__module__", None) == target
            ]
        for name in names:
            found[f"{target}.{name}"] = getattr(module, name)
    return found


def public_objects() -> dict[str, Any]:
    """Qualified public name -> object, each object once (its first public name)."""
    found: dict[str, Any] = {}
    for name in api_modules():
        module = importlib.import_module(name)
        for attr in module.__all__:
            found[f"{name}.{attr}"] = getattr(module, attr)
    found.update({k: v for k, v in documented().items() if k not in found})
    seen: set[int] = set()
    unique = {}
    for name, obj in found.items():
        if id(obj) not in seen:
            seen.add(id(obj))
            unique[name] = obj
    return unique


@dataclass
class Entry:
    """One public entry point: a function, a class's constructor, or a public method."""

    name: str
    obj: Any  # the function, the class, or the raw class attribute of a method
    owner: type | None = None
    method: str | None = None

    @property
    def spec(self) -> Boundary | None:
        return boundary_of(self.obj)

    def call(self, kwargs: dict[str, Any]) -> Any:
        if self.method is None:
            return self.obj(**kwargs)
        if isinstance(self.obj, (classmethod, staticmethod)):
            return getattr(self.owner, self.method)(**kwargs)
        # The boundary checks before the body runs: any object can stand for ``self``.
        return self.obj(object(), **kwargs)


def _own_public_methods(cls: type) -> list[tuple[str, Any]]:
    from precision_plugin._base.boundary.checker import _overrides_framework

    out = []
    for name, member in vars(cls).items():
        if (name.startswith("_") and name != "__call__") or _overrides_framework(cls, name):
            continue
        func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if isinstance(func, types.FunctionType):
            out.append((name, member))
    return out


#: Public objects without a boundary check, and why.
EXEMPT_OBJECTS: dict[str, str] = {
    **{
        f"precision_plugin._base.constraints.{name}": "a declaration marker (annotated-types "
        "metadata): built once in an annotation at import, read by the boundary"
        for name in ("Finite", "Whole", "Each", "Ordered", "AtMost", "Brackets")
    },
    **{
        f"precision_plugin._base.constraints.{name}": "read by the checker itself, which builds on "
        "this module (a boundary check here would be an import cycle)"
        for name in ("constraints_of", "validator_for", "relations_for")
    },
    "precision_plugin.probe.RolloutEngine": "a typing.Protocol: describes what an engine "
    "provides; never constructed or called",
    "precision_plugin._core.scoring.Scorer": "a typing.Protocol: describes what a scoring engine "
    "provides; never constructed or called",
    **{
        f"precision_plugin._core.scoring.float16_cpu.{name}": "called by the plugin's own engines on "
        "models and tensors they built (and by transformers, per layer and decode step, for "
        "float16_attention); a check per call would sit in the decode loop"
        for name in (
            "widen_float16",
            "widen_float16_linears",
            "widen_float16_attention",
            "float16_autocast_linears",
            "float16_attention",
            "sdpa_float16",
            "widened",
            "widened_dtypes",
        )
    },
    **{
        f"precision_plugin._core.scoring.packed_cpu.{name}": "called by the plugin's own engines on "
        "models and tensors they built (packed_product per linear layer and decode step); a "
        "check per call would sit in the decode loop"
        for name in ("pack_linears", "rows_for", "packs", "packed_product", "trainer_kernels")
    },
    **{
        f"precision_plugin._core.scoring.fused_cpu.{name}": "called by the plugin's own engine on "
        "the model it built (SharedInputProduct per linear layer and decode step); a check per "
        "call would sit in the decode loop"
        for name in ("fuse_shared_inputs", "fusable", "SharedInputProduct")
    },
    **{
        f"precision_plugin._core.scoring.multinomial_cpu.{name}": "called by the plugin's own engine "
        "on the generators and probabilities it built (Multinomial.sample per decode step); a "
        "check per call would sit in the decode loop"
        for name in ("Multinomial", "exact_draw")
    },
}


def exemption(name: str, obj: Any) -> str | None:
    """Why a public object has no boundary check of its own, or ``None``."""
    if name in EXEMPT_OBJECTS:
        return EXEMPT_OBJECTS[name]
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "an exception: the plugin raises it with its message"
    if not callable(obj) or isinstance(obj, types.ModuleType):
        return "a constant"
    if getattr(obj, "__module__", "") == "precision_plugin.hookspecs":
        return "a hook specification: pluggy calls the implementations with the core's arguments"
    if not getattr(obj, "__module__", "").startswith("precision_plugin"):
        return "not the plugin's (re-exported from another library)"
    return None


def entries() -> list[Entry]:
    out: list[Entry] = []
    for name, obj in public_objects().items():
        if exemption(name, obj) is not None:
            continue
        out.append(Entry(name, obj))
        if isinstance(obj, type):
            for method, member in _own_public_methods(obj):
                out.append(Entry(f"{name}.{method}", member, obj, method))
    return out


ENTRIES = entries()


def test_the_enumeration_finds_the_public_api() -> None:
    names = {e.name for e in ENTRIES}
    # A few that must be there, from each source: the package, a subpackage, docs/api.md.
    assert {
        "precision_plugin.enable",
        "precision_plugin._core.overflow.headroom",
        "precision_plugin._core.overflow.OverflowDetector.begin_step",
        "precision_plugin.trl.HFRollout.__call__",
        "precision_plugin._core.metrics.mismatch.compute_mismatch",
        "precision_plugin._core.frameworks.grad_scaler",
    } <= names
    assert len(ENTRIES) >= 150, len(ENTRIES)


def test_every_public_entry_point_is_checked() -> None:
    missing = [e.name for e in ENTRIES if e.spec is None]
    assert not missing, (
        f"{len(missing)} public entry point(s) without @checked (decorate them, or exempt them "
        f"in EXEMPT_OBJECTS with the reason): {missing}"
    )


#: Names defined in a module docs/api.md documents member by member that are left out of the
#: documentation on purpose: helpers of the documented API and of the adapters (no boundary
#: check of their own; the hot ones, ``sums_of`` and ``consequence_sums_of``, skip it by design).
#: A new public name in such a module fails ``test_a_documented_module_has_no_stray_public_name``
#: until it is documented (and so checked) or listed here.
INTERNAL: dict[str, set[str]] = {
    "precision_plugin._base.constraints": {"Invalid", "Declared", "Across", "plain"},  # the checker's side
    "precision_plugin._core.manager": {
        "get_plugin_manager", "call_each_reported", "adapter_names", "coerce_policy",
        "adapter_patcher",
    },
    "precision_plugin.audit": {
        "learner_side", "colocated_vllm_dtype", "rollout_side", "render", "fix_of",
    },
    "precision_plugin._core.master_weights": {"prepare_model_once"},
    "precision_plugin._core.scoring.float16_cpu": {"widens_cache"},  # read by scoring.kvcache
    # the layer classes' shared pieces, read by float16_cpu (outside_dispatch_modes and
    # version: fused_cpu)
    "precision_plugin._core.scoring.packed_cpu": {
        "pack", "stamp", "packed_weight", "recording", "swap_linears", "packing",
        "outside_dispatch_modes", "version",
    },
    "precision_plugin._core.scaler": {
        "TelemetryGradScaler", "Fp16GradScaler", "attach_telemetry", "scaler_stats",
        "consecutive_skips", "build_grad_scaler",  # make_grad_scaler's core (a resolved policy)
    },
    "precision_plugin.probe.advice": {
        "BucketConsequence", "dtype_consequence", "classify", "ess_text", "dtype_line",
    },
    "precision_plugin.probe.layerwise": {"stages_of", "outliers", "longest"},
    "precision_plugin._core.metrics.mismatch": {
        "alias_table", "prefixed", "masked_log_ratio", "sums_of", "fit_drift",
    },
    "precision_plugin._core.metrics.consequence": {
        "consequence_sums_of", "chi2_quantile", "mask_fraction", "ess_interval",
    },
    "precision_plugin._core.intervals": {
        "z_value", "chi2_ppf", "robust_bounds", "tail_bounds", "heavy_tails", "standard_draws",
        "ess_hull",
    },
    "precision_plugin._core.decision": {"percent"},
    # the engine arguments slime_args builds on, and AReaL's sglang-backend test
    "precision_plugin.slime": {"slime_engine_args"},
    "precision_plugin.areal": {"uses_sglang"},
}  # fmt: skip


def documented_modules() -> dict[str, set[str]]:
    """Each module (not package) docs/api.md documents with a ``members`` list: those members."""
    text = (ROOT / "docs" / "api.md").read_text()
    out: dict[str, set[str]] = {}
    for match in re.finditer(r"^::: (\S+)((?:\n    .*)*)", text, re.M):
        members = re.search(r"members: \[(.*?)\]", match.group(2))
        if members is None:
            continue
        try:
            module = importlib.import_module(match.group(1))
        except ImportError:
            continue
        if not hasattr(module, "__path__"):  # a package's public names are its __all__
            out[match.group(1)] = {n.strip() for n in members.group(1).split(",")}
    return out


def test_a_documented_module_has_no_stray_public_name() -> None:
    """A public function or class added to a documented module is public API: documented in
    docs/api.md (then enumerated above, so it must be @checked) or declared internal."""
    stray = []
    for target, members in documented_modules().items():
        module = importlib.import_module(target)
        for name, obj in vars(module).items():
            defined_here = getattr(obj, "__module__", None) == target
            kind = inspect.isfunction(obj) or inspect.isclass(obj)
            if name.startswith("_") or not defined_here or not kind or name in members:
                continue
            if name not in INTERNAL.get(target, set()):
                stray.append(f"{target}.{name}")
    assert not stray, (
        f"public name(s) neither in docs/api.md nor in INTERNAL (document them, which puts them "
        f"under the boundary test, or declare them internal): {stray}"
    )
    stale = [
        f"{t}.{n}"
        for t, names in INTERNAL.items()
        for n in names
        if not hasattr(importlib.import_module(t), n) or n in documented_modules().get(t, set())
    ]
    assert not stale, f"INTERNAL names what is gone or documented now: {stale}"


def test_exemptions_name_public_objects() -> None:
    public = public_objects()
    assert set(EXEMPT_OBJECTS) <= set(public), set(EXEMPT_OBJECTS) - set(public)


#: Public parameters annotated ``Any`` without a validator, and why nothing is checked there.
#: Any other such parameter fails ``test_a_parameter_typed_any_is_validated``: ``Any`` checks
#: nothing, so a wrong argument would first be noticed deep inside (an ``AttributeError``).
UNCHECKED_ANY: dict[str, str] = {
    "precision_plugin._core.configs.Dialect.value raw": "any value a config holds: reading it by the "
    "program's rules (or refusing it, naming the key) is what the method does",
    "precision_plugin.PrecisionCallback.collect optimizer": "whatever optimizer the trainer "
    "holds (or None); the adapters read only what it has",
    "precision_plugin.deepspeed.engine_dtype engine": "any object: None for one the plugin "
    "does not track",
    "precision_plugin.audit.audit_run args": "the trainer's arguments, or None: read with "
    "defaults, as the callback passes what it has",
    "precision_plugin.audit.audit_run trainer": "the trainer, or None: read with defaults",
    "precision_plugin._core.frameworks.flags_of args": "any TrainingArguments-like object, read with "
    "defaults (TRL's unset bf16=None reads as off)",
    "precision_plugin._core.frameworks.deepspeed_flag value": "a config value of any type, read as "
    "DeepSpeed reads it (None where DeepSpeed refuses it)",
    "precision_plugin._core.frameworks.deepspeed_autocast_flag value": "a config value of any type, "
    "read as DeepSpeed reads it (a truth test)",
    "precision_plugin._core.frameworks.sglang_runs value": "a config value of any type, read as "
    "SGLang reads it (refused with the plugin's error where SGLang refuses it)",
    "precision_plugin._core.frameworks.settle_once obj": "any object the decision is marked on",
    "precision_plugin.probe.ProbeResult overflow": "a result record's field (built by the probe)",
    "precision_plugin.probe.ProbeResult consequence": "a result record's field (built by the "
    "probe)",
    "precision_plugin.probe.ProbeResult layerwise": "a result record's field (built by the probe)",
    "precision_plugin.probe.ProbeResult attribution": "a result record's field (built by the "
    "probe)",
    "precision_plugin._core.sampling.LogitsProcessor.add tokens": "the engine's own tensor, once per "
    "sampled token: a value check there would cost a device sync per token",
    "precision_plugin._core.sampling.LogitsProcessor.process logits": "the engine's own tensor, once "
    "per sampled token (as above)",
    "precision_plugin._core.sampling.LogitsProcessor.process stop": "the engine's own tensor, once per "
    "sampled token (as above)",
    "precision_plugin._core.sampling.LogitsProcessor.keep rows": "the engine's own index tensor, each "
    "time a sequence finishes inside the decode loop (as above)",
    "precision_plugin._base.patching.Patcher.setattr target": "any object an adapter patches",
    "precision_plugin._base.patching.Patcher.setattr value": "any value an adapter sets",
    "precision_plugin._base.patching.Patcher.wrap target": "any object an adapter patches",
    "precision_plugin._base.patching.Patcher.around target": "any object an adapter patches",
}


def _untyped(entry: Entry) -> list[str]:
    spec = entry.spec
    hints = spec.hints()
    return [
        f"{entry.name} {p.name}"
        for p in spec.parameters
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and Any in _arms(hints.get(p.name, Any))
        and p.name not in spec.validators
    ]


def test_a_parameter_typed_any_is_validated() -> None:
    """A public parameter annotated ``Any`` has a validator (``duck``, ``torch_module``, ...)
    or a reason in ``UNCHECKED_ANY``: a new one fails here, not in a user's run."""
    found = [name for e in ENTRIES if e.spec is not None for name in _untyped(e)]
    missing = sorted(set(found) - set(UNCHECKED_ANY))
    assert not missing, (
        f"public parameter(s) typed Any with no validator (add one to @checked, or a reason "
        f"to UNCHECKED_ANY): {missing}"
    )
    stale = sorted(set(UNCHECKED_ANY) - set(found))
    assert not stale, f"UNCHECKED_ANY names what is validated now (or gone): {stale}"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_every_annotation_resolves(entry: Entry) -> None:
    """A parameter's type is checked only when its annotation resolves at run time (a name
    imported only under TYPE_CHECKING would not)."""
    spec = entry.spec
    if spec is None:
        pytest.skip("not checked (see test_every_public_entry_point_is_checked)")
    spec._hints = None
    spec.hints()


# -- calling the API with one wrong argument ---------------------------------------------------


class _Scorer:
    """A scoring engine (``precision_plugin._core.scoring.Scorer``): every token at log-prob -1."""

    name = "constant"

    def score(self, sequences: Any) -> list[list[float]]:
        return [[-1.0] * len(s.completion_ids) for s in sequences]


class _Tokenizer:
    """What the prompt builders call a tokenizer."""

    pad_token_id = 0

    def __call__(self, text: str) -> Any:
        return types.SimpleNamespace(input_ids=[1, 2, 3])

    def decode(self, ids: Any) -> str:
        return "x"


def _fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())


def candidates(tmp: Path) -> list[Any]:
    """Values tried, in order, as the valid argument of a required parameter: the first that
    passes its boundary check is used while another parameter gets a wrong one."""
    from packaging.version import Version

    from precision_plugin._base.patching import Patcher
    from precision_plugin._core.canary import CanaryMonitor
    from precision_plugin._core.metrics.consequence import (
        Interval,
        compute_consequence,
        fit_growth,
        project,
    )
    from precision_plugin._core.metrics.mismatch import compute_mismatch
    from precision_plugin._core.overflow import headroom
    from precision_plugin._core.scaler import ScalerStats
    from precision_plugin._core.scoring import BitwiseEqual, TokenSequence
    from precision_plugin.policy import LossScalerSettings, MetricSettings, OverflowSettings
    from precision_plugin.probe import ProbeConfig, RolloutSample, SelfCheck
    from precision_plugin.sanity import SanityConfig
    from precision_plugin.vllm import cascade_decision

    file = tmp / "file.txt"
    file.write_text("hello\n")
    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(temperature=1.0, max_completion_length=4),
        state=types.SimpleNamespace(global_step=0),
        accelerator=None,
        callback_handler=types.SimpleNamespace(callbacks=[]),
    )
    model = _fresh_model()
    growth = fit_growth([0.1, -0.2, 0.3], [4, 8, 16])
    return [
        precision_plugin.PrecisionPolicy(),
        model,
        "float16",
        "cpu",
        "warn",
        "0.9.1",
        "precision_install",
        str(file),
        str(tmp),
        ["Hello"],
        1,
        0.5,
        True,
        [[-0.5, -0.25]],
        [],
        {},
        (),
        torch.zeros(1, 2),
        compute_mismatch([[-0.1]], [[-0.2]]),
        MetricSettings(),
        LossScalerSettings(),
        OverflowSettings(),
        ScalerStats(1.0),
        Patcher("test"),
        lambda *a, **k: None,
        Version("0.9.1"),
        cascade_decision(None),
        headroom(model, torch.zeros(1, 2)),
        ProbeConfig(),
        SamplingSettings(),
        SelfCheck(True, 0.0, 1e-6, "float32 paths agree"),
        SanityConfig(),
        torch.zeros(len(SUM_FIELDS), dtype=torch.float64),  # mismatch_sums()'s sums
        {"actor_rollout_ref": {"rollout": {"dtype": "float16"}}},  # a verl config
        {"actor": {"dtype": "float16"}},  # an AReaL config
        {"dtype": "float16"},  # an SGLang server's /server_info answer
        {"ds.param_dtype": "fp16"},  # OpenRLHF's parsed arguments
        "TRL",  # a system of the alias table
        "argparse",  # a family of config readers (precision_plugin._core.configs)
        "switch",  # a kind of config key (precision_plugin._core.configs.Key)
        precision_plugin._core.configs.VERL,  # a dialect of the config reader
        "http://localhost:8000",  # a server's base URL
        _Tokenizer(),
        torch.zeros(len(COUNT_FIELDS), dtype=torch.float64),  # consequence_sums()'s counts
        trainer,  # a trainer, as the boundary sees one
        types.SimpleNamespace(step=None, global_steps=0, optimizer=None),  # a DeepSpeed engine
        types.SimpleNamespace(model_config=types.SimpleNamespace(dtype="float16")),  # vllm.LLM
        types.SimpleNamespace(config=None, forward=None),  # a transformers model
        RolloutSample([1], [2], [-0.5]),
        compute_consequence([[-0.1, -0.2]], [[-0.2, -0.1]]),
        growth,
        project(growth, 100),
        Interval(0.5, 0.4, 0.6),
        (0.5, 0.4, 0.6),  # a (value, low, high) of the decision's evidence
        _Scorer(),
        BitwiseEqual(1, 1),
        [TokenSequence((1,), (2,))],
        types.SimpleNamespace(name="test", score=lambda sequences: []),  # a Scorer
        types.SimpleNamespace(equal=None, batch_size=2),  # a BatchRescore, as duck-typed
        2,  # a batch size of at least 2 (the batch-invariance check)
        TokenSequence((1,), (2,)),  # one canary sequence
        CanaryMonitor(),  # the canary's state (precision_plugin._core.canary.workers)
        frozenset({"FLASH_ATTN"}),  # attention backends (precision_plugin.vllm.invariance)
    ]


def required(spec: Boundary) -> list[inspect.Parameter]:
    return [
        p
        for p in spec.parameters
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def baseline(entry: Entry, tmp: Path) -> dict[str, Any]:
    """Valid arguments for every required parameter of ``entry``."""
    spec = entry.spec
    assert spec is not None
    kwargs: dict[str, Any] = {}
    for param in required(spec):
        hint = spec.hints().get(param.name, Any)
        literal = [a for a in _arms(hint) if typing.get_origin(a) is typing.Literal]
        for value in [typing.get_args(literal[0])[0]] if literal else candidates(tmp):
            try:
                spec._one(param.name, value, spec.hints().get(param.name, Any), param)
            except PrecisionConfigError:
                continue
            kwargs[param.name] = value
            break
        else:
            pytest.fail(f"{entry.name}: no example passes the check of {param.name!r}")
    return kwargs


def wrong_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=6),
        st.binary(max_size=3),
        st.lists(st.one_of(st.integers(), st.text(max_size=2), st.none()), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        st.tuples(st.text(max_size=2)),
        st.builds(object),
        st.just(torch.zeros(2, 3)),
        st.builds(_fresh_model),
    )


def keyword_params(spec: Boundary) -> list[inspect.Parameter]:
    return [p for p in spec.parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def expect_refusal(entry: Entry, kwargs: dict[str, Any], param: str) -> None:
    """Calling ``entry`` raises one line of PrecisionConfigError naming ``param``, and leaves
    nothing changed (nor any model passed in)."""
    before = snapshot()
    with pytest.raises(PrecisionConfigError) as info:
        entry.call(kwargs)
    text = str(info.value)
    assert "\n" not in text, text
    assert repr(param) in text, text
    assert_unchanged(before, f"{entry.name}({param}=...)")
    for value in kwargs.values():
        if isinstance(value, torch.nn.Module):
            assert model_untouched(value), f"{entry.name} changed the model"


CHECKED = [e for e in ENTRIES if e.spec is not None]

SETTINGS = settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("entry", CHECKED, ids=[e.name for e in CHECKED])
@SETTINGS
@given(data=st.data())
def test_a_wrong_type_raises_only_the_plugins_error(entry: Entry, data: Any, tmp_path: Path):
    spec = entry.spec
    hints = spec.hints()
    typed = [p for p in keyword_params(spec) if Any not in _arms(hints.get(p.name, Any))]
    if not typed:
        return  # nothing has a wrong type (test_an_unknown_argument covers the entry)
    param = data.draw(st.sampled_from(typed), label="parameter")
    value = data.draw(wrong_values(), label="value")
    assume(_mismatch(value, hints[param.name]) is not None)
    kwargs = baseline(entry, tmp_path)
    kwargs[param.name] = value
    if spec.typed:
        expect_refusal(entry, kwargs, param.name)
        return
    # A class that checks its own fields (the policy) may accept more than its annotations say
    # (dtype="fp16", a section as a dict); what it refuses, it refuses with its own error.
    before = snapshot()
    try:
        entry.call(kwargs)
    except PrecisionConfigError as exc:
        assert "\n" not in str(exc) and param.name in str(exc), str(exc)
    assert_unchanged(before, f"{entry.name}({param.name}=...)")


def out_of_range(validator: Validator) -> st.SearchStrategy[Any]:
    """Values of the right type that ``validator`` refuses."""
    strategies = [st.sampled_from(validator.bad)] if validator.bad else []
    if validator.bounds is not None:
        low, high, integer = validator.bounds
        number = st.integers if integer else st.floats
        if low is not None:
            below = math.ceil(low) - 1 if integer else low
            kw = {"max_value": below} if integer else {"max_value": below, "exclude_max": True}
            strategies.append(number(**kw, **({} if integer else {"allow_nan": False})))
        if high is not None:
            above = math.floor(high) + 1 if integer else high
            kw = {"min_value": above} if integer else {"min_value": above, "exclude_min": True}
            strategies.append(number(**kw, **({} if integer else {"allow_nan": False})))
    return st.one_of(*strategies)


def validated(spec: Boundary) -> list[tuple[inspect.Parameter, Validator]]:
    from precision_plugin._base.boundary import policy_arg

    try:
        hints = spec.hints()
    except NameError:  # test_every_annotation_resolves names it
        hints = {}
    out = []
    for param in keyword_params(spec):
        validator = spec.validators.get(param.name)
        hint = hints.get(param.name, Any)
        if validator is None and _takes_policy(hint) and str in _arms(hint):
            validator = policy_arg
        if validator is not None and (validator.bad or validator.bounds):
            out.append((param, validator))
    return out


VALIDATED = [e for e in CHECKED if validated(e.spec)]


@pytest.mark.parametrize("entry", VALIDATED, ids=[e.name for e in VALIDATED])
@SETTINGS
@given(data=st.data())
def test_an_out_of_range_value_raises_only_the_plugins_error(
    entry: Entry, data: Any, tmp_path: Path
):
    spec = entry.spec
    param, validator = data.draw(st.sampled_from(validated(spec)), label="parameter")
    value = data.draw(out_of_range(validator), label="value")
    hint = spec.hints().get(param.name, Any)
    assume(_mismatch(value, hint) is None)  # a wrong type is the other test's
    assume(not (value is None and param.default is None))
    kwargs = baseline(entry, tmp_path)
    kwargs[param.name] = value
    expect_refusal(entry, kwargs, param.name)


@pytest.mark.parametrize("entry", CHECKED, ids=[e.name for e in CHECKED])
def test_an_unknown_argument_raises_only_the_plugins_error(entry: Entry, tmp_path: Path):
    spec = entry.spec
    if any(p.kind is p.VAR_KEYWORD for p in spec.parameters):
        pytest.skip("takes any keyword (checked by what it passes them to)")
    kwargs = baseline(entry, tmp_path)
    kwargs["no_such_argument"] = 1
    expect_refusal(entry, kwargs, "no_such_argument")


def test_the_count_of_entry_points(capsys: pytest.CaptureFixture[str]) -> None:
    """How many entry points these properties cover (printed: the figure of the closing note)."""
    with capsys.disabled():
        print(f"\npublic entry points checked at the boundary: {len(CHECKED)} of {len(ENTRIES)}")
    assert len(CHECKED) == len(ENTRIES)
