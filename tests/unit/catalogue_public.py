"""Bad inputs of issue 52, classes 7-9: the public call, an API no more lenient than the CLI, and
dtype spellings compared through the one parser.

7. A refusal the docs promise reaches the public call: each is tried through ``enable()``,
   ``PrecisionCallback``, the DeepSpeed entry (``"precision_plugin": {...}``) and the CLI, not
   only through the inner function (``enable("bfloat16", dtype="float16")`` ran float16: the
   boundary built the policy before the conflict check saw the name).
8. The API refuses what the CLI refuses (``openrlhf.runtime_env("float32")``,
   ``decision.apply_forms("fp8")``, a DeepSpeed config holding both ``"precision_plugin"`` and
   ``"precision-plugin"``).
9. One dtype, however spelled (``fp16``, ``float16``, ``torch.float16``), is one dtype; a value
   that only looks right (a NaN saved ``inv_freq``, ``vllm.num_engines -1``) is refused.

Rows for the catalogue of ``tests/unit/test_bad_inputs.py`` (each a ``Case``'s keyword
arguments); ``rows(h)`` takes that module, for its helpers (``cli``, ``apply``, ``write``). A row
with ``raises=None`` holds the correct outcome, computed independently, in ``check``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import precision_plugin as pp
from precision_plugin import PrecisionConfigError, PrecisionPolicy

TWICE = "dtype is given twice with different values"
TYPO = {"loss_scaler": {"growth_intervall": 200}}
TYPO_NAMES = ("loss_scaler.growth_intervall", "Did you mean 'loss_scaler.growth_interval'?")


def call(module: str, name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    """``precision_plugin.<module>.<name>(*args, **kw)``."""

    def run(tmp: Path) -> Any:
        import importlib

        return getattr(importlib.import_module(f"precision_plugin.{module}"), name)(*args, **kw)

    return run


def equals(expected: Any) -> Callable[[Any, Any], None]:
    def check(result: Any, caplog: Any) -> None:
        assert result == expected, result

    return check


class _Rotary(torch.nn.Module):
    """A RoPE module as transformers builds one: a non-persistent ``inv_freq`` buffer."""

    def __init__(self) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
        self.register_buffer("inv_freq", inv_freq, persistent=False)


def restore_saved(value: Callable[[], Any]) -> Callable[[Path], Any]:
    """Cast a model holding ``rotary.inv_freq`` to float16, then ``keep_float32_buffers`` it
    with ``value()`` saved for that buffer: ``(its answer, the buffer)``; a refusal leaves the
    model as the cast left it."""

    def run(tmp: Path) -> Any:
        from precision_plugin._core.buffers import keep_float32_buffers

        model = torch.nn.Module()
        model.rotary = _Rotary()
        model.to(torch.float16)
        before = model.rotary.inv_freq.clone()
        try:
            done = keep_float32_buffers(model, {"rotary.inv_freq": value()})
        except PrecisionConfigError:
            after = model.rotary.inv_freq
            assert after.dtype == torch.float16 and torch.equal(after, before), after
            raise
        return done, model.rotary.inv_freq

    return run


def restored_exactly(result: Any, caplog: Any) -> None:
    done, buf = result
    assert done == {"rotary.inv_freq": "saved"}, done
    exact = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    assert buf.dtype == torch.float32 and torch.equal(buf, exact), buf


def audit(learner: dict[str, Any], rollout: dict[str, Any], **policy: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.audit import contradictions

        return contradictions(PrecisionPolicy(**policy), learner, {"engine": "vLLM", **rollout})

    return run


ROOT = Path(__file__).resolve().parents[2]


def recipe(path: str, *args: str) -> Callable[[Path], Any]:
    """``python RECIPE args`` as a user runs it: ``(exit code, its stderr)``."""

    def run(tmp: Path) -> Any:
        done = subprocess.run(
            [sys.executable, str(ROOT / path), *args],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return done.returncode, done.stderr

    return run


def refused_in_one_line(*words: str) -> Callable[[Any, Any], None]:
    """A recipe's refusal: no traceback, the last line argparse's ``error:`` (exit 2) or the
    recipe's ``stopped:`` (exit 1), naming each of ``words``."""

    def check(result: Any, caplog: Any) -> None:
        code, err = result
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err, err
        assert ("error:" in last and code == 2) or ("stopped:" in last and code == 1), err
        for word in words:
            assert word in last, last

    return check


def rows(h: Any) -> list[dict[str, Any]]:
    """The rows, built with the helpers of ``tests/unit/test_bad_inputs.py`` (``h``)."""
    out: list[dict[str, Any]] = []

    def bad(id: str, cls: str, run: Any, *names: str, **kw: Any) -> None:
        out.append({"id": id, "cls": cls, "run": run, "raises": PrecisionConfigError,
                    "names": names, **kw})  # fmt: skip

    def good(id: str, cls: str, run: Any, check: Any) -> None:
        out.append({"id": id, "cls": cls, "run": run, "raises": None, "check": check})

    def on_cli(id: str, run: Any, *names: str, **kw: Any) -> None:
        out.append({"id": id, "cls": "cli", "run": run, "names": names, **kw})

    # -- 7. the dtype given twice, through enable() itself (each form of the policy) ----------------
    for form, policy in (
        ("name", "bfloat16"),
        ("alias", "bf16"),
        ("dict", {"dtype": "bfloat16"}),
        ("PrecisionPolicy", PrecisionPolicy(dtype="bfloat16")),
    ):
        shown = repr(policy if isinstance(policy, str) else "bfloat16")
        bad(
            f"public enable {form} and dtype keyword",
            "enable",
            lambda t, p=policy: pp.enable(p, dtype="float16"),
            f"enable(): {TWICE}, {shown} in the policy and dtype='float16' as a keyword",
        )
    bad(
        "public enable PrecisionPolicy strictness and keyword",
        "enable",
        lambda t: pp.enable(PrecisionPolicy(strictness="error"), strictness="warn"),
        "strictness is given twice",
        "'error' in the policy and strictness='warn'",
    )

    # -- 7. the policy refusals docs/policy.md promises, through each public call ----------------
    # enable(): a dtype that is no training precision, an unknown key, a strictness typo
    bad("public enable fp8 name", "enable", lambda t: pp.enable("fp8"), "'policy'", "'fp8'")
    bad("public enable fp8 dict", "enable", lambda t: pp.enable({"dtype": "fp8"}), "'fp8'")
    bad("public enable key typo", "enable", lambda t: pp.enable(TYPO), *TYPO_NAMES)
    bad("public enable key typo keyword", "enable", lambda t: pp.enable(**TYPO), *TYPO_NAMES)
    bad(
        "public enable strictness typo",
        "enable",
        lambda t: pp.enable(strictness="strict"),
        "strictness",
        "'strict'",
    )
    # PrecisionCallback
    bad(
        "public callback fp8",
        "policy",
        lambda t: pp.PrecisionCallback("fp8"),
        "PrecisionCallback()",
        "'fp8'",
    )
    bad("public callback key typo", "policy", lambda t: pp.PrecisionCallback(TYPO), *TYPO_NAMES)
    bad(
        "public callback strictness typo",
        "policy",
        lambda t: pp.PrecisionCallback({"strictness": "strict"}),
        "strictness",
        "'strict'",
    )
    # the DeepSpeed entry, as a dict and as a file
    bad(
        "public ds section key typo",
        "policy",
        h.apply({"precision_plugin": TYPO}),
        '"precision_plugin" section',
        *TYPO_NAMES,
    )
    bad(
        "public ds section strictness typo",
        "policy",
        h.apply({"precision_plugin": {"strictness": "strict"}}),
        '"precision_plugin" section',
        "strictness",
    )
    bad(
        "public ds file section key typo",
        "policy",
        h.apply(lambda t: str(h.write(t, "ds.json", json.dumps({"precision_plugin": TYPO})))),
        *TYPO_NAMES,
    )
    # the CLI: the policy comes from PRECISION_PLUGIN
    on_cli(
        "public cli key typo env",
        h.cli("openrlhf-args"),
        "PRECISION_PLUGIN",
        "growth_intervall",
        env={"PRECISION_PLUGIN": json.dumps(TYPO)},
    )
    on_cli(
        "public cli strictness typo env",
        h.cli("openrlhf-args"),
        "PRECISION_PLUGIN",
        "strictness",
        env={"PRECISION_PLUGIN": '{"strictness": "strict"}'},
    )

    # -- 8. the API refuses what the CLI refuses ----------------------------------------------
    bad(
        "public openrlhf runtime_env float32",
        "conflict",
        call("openrlhf", "runtime_env", "float32"),
        "float32",
        "bf16 or fp16 only",
        "dtype='float16' or 'bfloat16'",
    )
    bad(
        "public openrlhf runtime_env fp32 alias",
        "conflict",
        call("openrlhf", "runtime_env", {"dtype": "fp32"}),
        "float32",
        "bf16 or fp16 only",
    )
    bad(
        "public openrlhf runtime_env float32 enabled",
        "conflict",
        call("openrlhf", "runtime_env"),
        "float32",
        "bf16 or fp16 only",
        enable={"dtype": "float32"},
    )
    on_cli(
        "public cli openrlhf runtime-env fp32",
        h.cli("openrlhf-args", "--runtime-env", "--dtype", "fp32"),
        "--runtime-env",
        "float32",
        "--dtype float16 or bfloat16",
    )
    bad(
        "public apply_forms fp8",
        "conflict",
        call("_core.decision", "apply_forms", "fp8"),
        "apply_forms(): argument 'dtype'",
        "'fp8'",
    )
    bad(
        "public apply_forms blank module",
        "conflict",
        call("_core.decision", "apply_forms", "float16", [""]),
        "apply_forms(): argument 'keep_fp32_modules'",
        "non-empty",
    )
    # an alias is printed as the name enable() takes (and the default as no argument at all)
    good(
        "public apply_forms fp16 is enable()",
        "conflict",
        lambda t: __import__("precision_plugin._core.decision", fromlist=["x"]).apply_forms("fp16"),
        equals(
            {
                "python": "precision_plugin.enable()",
                "deepspeed": '"precision_plugin": {"dtype": "float16"}',
                "env": "PRECISION_PLUGIN=float16",
            }
        ),
    )
    good(
        "public apply_forms bf16 is bfloat16",
        "conflict",
        lambda t: __import__("precision_plugin._core.decision", fromlist=["x"]).apply_forms("bf16")[
            "python"
        ],
        equals("precision_plugin.enable(dtype='bfloat16')"),
    )
    both = {"precision_plugin": {"dtype": "float16"}, "precision-plugin": {"dtype": "bfloat16"}}
    bad(
        "public ds both section spellings",
        "conflict",
        h.apply(both),
        'DeepSpeed config key "precision-plugin"',
        'move its keys into "precision_plugin"',
    )
    bad(
        "public ds both section spellings file",
        "conflict",
        h.apply(lambda t: str(h.write(t, "ds.json", json.dumps(both)))),
        '"precision-plugin"',
    )
    bad(
        "public ds both section spellings PrecisionPlugin",
        "conflict",
        h.apply({"precision_plugin": {}, "PrecisionPlugin": {"dtype": "bfloat16"}}),
        '"PrecisionPlugin"',
    )

    # -- 9. one dtype however spelled; a value that only looks right -----------------------------
    good(
        "public audit rollout fp16 learner float16",
        "conflict",
        audit({}, {"dtype": "fp16"}),
        equals({}),
    )
    good(
        "public audit rollout torch.float16",
        "conflict",
        audit({"forward_dtype": torch.float16}, {"dtype": torch.float16}),
        equals({}),
    )
    good(
        "public audit asked half",
        "conflict",
        audit({"forward_dtype": "float16"}, {"dtype": None, "asked": "half"}),
        equals({}),
    )
    good(
        "public audit buffers spelled fp32",
        "conflict",
        audit({}, {"dtype": "float16", "float32_buffers": {"fp32": 64, "torch.float32": 8}}),
        equals({}),
    )
    good(
        "public audit bf16 rollout is named bfloat16",
        "conflict",
        audit({"forward_dtype": torch.float16}, {"dtype": "bf16"}),
        equals(
            {
                "rollout": "rollout: vLLM runs bfloat16 while the learner runs float16 "
                "(policy float16)"
            }
        ),
    )
    good(
        "public audit fix of bf16 rollout beside fp16 learner",
        "conflict",
        lambda t: __import__("precision_plugin.audit", fromlist=["x"]).fix_of(
            "rollout",
            {"rollout": {"dtype": "bf16"}, "learner": {"forward_dtype": torch.float32}},
            PrecisionPolicy(dtype="bfloat16"),
        ),
        equals(
            "the rollout already runs the policy's bfloat16; the learner does not (its forward "
            "ran in float32): call precision_plugin.enable() before building the trainer"
        ),
    )
    bad(
        "public inv_freq saved NaN",
        "state",
        restore_saved(lambda: torch.full((4,), float("nan"))),
        "keep_float32_buffers(): saved['rotary.inv_freq'] holds NaN or infinite values",
        "float32_buffers(model)",
    )
    bad(
        "public inv_freq saved inf",
        "state",
        restore_saved(lambda: torch.tensor([1.0, float("inf"), 0.1, 0.01])),
        "saved['rotary.inv_freq'] holds NaN or infinite values",
    )
    bad(
        "public inv_freq saved wrong shape",
        "state",
        restore_saved(lambda: torch.ones(8)),
        "saved['rotary.inv_freq'] has shape (8,), the buffer (4,)",
    )
    bad(
        "public inv_freq saved list",
        "state",
        restore_saved(lambda: [1.0, 0.1, 0.01, 0.001]),
        "saved['rotary.inv_freq'] is list, not a floating-point tensor",
    )
    good(
        "public inv_freq saved exact",
        "state",
        restore_saved(lambda: _Rotary().inv_freq),
        restored_exactly,
    )
    bad(
        "public openrlhf num_engines -1",
        "configs",
        call("openrlhf", "find_problems", {"vllm.num_engines": -1}, "float16"),
        "--vllm.num_engines is -1",
        "pass 0 or more",
    )
    bad(
        "public openrlhf num_engines -1 nested",
        "configs",
        call("openrlhf", "check_args", {"vllm": {"num_engines": -1}}, "float16"),
        "--vllm.num_engines is -1",
    )
    bad(
        "public openrlhf num_engines '-2' text",
        "configs",
        call("openrlhf", "find_problems", {"vllm.num_engines": "-2"}, "float16"),
        "--vllm.num_engines is -2",
    )
    bad(
        "public openrlhf tensor_parallel_size 0",
        "configs",
        call(
            "openrlhf",
            "find_problems",
            {"vllm.num_engines": 1, "ds.tensor_parallel_size": 0},
            "float16",
        ),
        "--ds.tensor_parallel_size is 0",
        "pass 1 or more",
    )
    bad(
        "public openrlhf vllm tensor_parallel_size -1",
        "configs",
        call(
            "openrlhf",
            "find_problems",
            {"vllm.num_engines": 1, "vllm.tensor_parallel_size": -1},
            "float16",
        ),
        "--vllm.tensor_parallel_size is -1",
    )
    # -- 10. the recipes' own flags, as a user runs them --------------------------------------
    grpo = "integrations/trl/grpo_fp16.py"
    for flag, value, words in (
        ("--canary-every", "-1", ("--canary-every", "'-1'", ">= 0")),
        ("--rollout-batch", "0", ("--rollout-batch", "'0'", ">= 1")),
        ("--learning-rate", "nan", ("--learning-rate", "'nan'", "finite")),
        ("--drill", "stale-weights@²", ("--drill", "stale-weights@STEP", "integer >= 1")),
        ("--model", "HuggingFaceTB/SmolLM2-135M", ("--model", "downloads nothing")),
    ):
        good(f"recipe grpo {flag} {value}", "cli", recipe(grpo, flag, value),
             refused_in_one_line(*words))  # fmt: skip
    good(
        "recipe accelerate --growth-interval -1",
        "cli",
        recipe("integrations/accelerate/train_fp16.py", "--growth-interval", "-1"),
        refused_in_one_line("--growth-interval", "'-1'"),
    )
    good(
        "recipe deepspeed --deepspeed a folder",
        "cli",
        recipe("integrations/deepspeed/train.py", "--deepspeed", "integrations"),
        refused_in_one_line("--deepspeed", "integrations"),
    )
    # -- 9. the vLLM checkpoint check reads every spelling of float16 --------------------------
    for spelling in ("fp16", "half"):
        bad(
            f"public check_engine_model gemma2 {spelling}",
            "conflict",
            lambda tmp, s=spelling: pp.model_risks.check_engine_model(
                h.gemma2(tmp), PrecisionPolicy(strictness="error"), dtype=s
            ),
            "gemma2",
            "bfloat16",
        )
    on_cli(
        "public cli probe layerwise float32 alone",
        h.cli("probe", "--layerwise", "--dtypes", "fp32"),
        "layerwise",
        "nothing to replay",
    )
    return out
