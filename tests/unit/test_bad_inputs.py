"""The bad-input catalogue: every entry point, tried as a new user would get it wrong.

Each case names the error it must raise (with a word of the message that names what to fix)
or the exact outcome, and every case checks that nothing changed afterwards: no policy active,
no patch left, the environment and the import machinery as they were. The count of cases is
quoted in docs/troubleshooting.md ("N bad inputs tried, each a clear error").
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import logging
import math
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import precision_plugin as pp
from precision_plugin import PrecisionConfigError, PrecisionMismatchError, PrecisionPolicy
from precision_plugin._core.metrics.mismatch import SUM_FIELDS
from precision_plugin.cli import main
from tests.unit.catalogue_files import rows as _file_rows
from tests.unit.catalogue_meaning import rows as _meaning_rows
from tests.unit.catalogue_numbers import rows as _number_rows
from tests.unit.catalogue_public import rows as _public_rows
from tests.unit.state import assert_unchanged as _assert_unchanged
from tests.unit.state import snapshot as _snapshot

DOCS = Path(__file__).resolve().parents[2] / "docs"
INF = float("inf")
NAN = float("nan")


@dataclass
class Case:
    """One bad input: ``run(tmp)`` must raise ``raises`` whose message contains ``names``
    (the setting to fix), or return a value ``check`` accepts (an exact outcome).

    ``enable`` (kwargs of ``pp.enable``) is applied before the bad call and undone after;
    ``env`` is set for the case; ``needs`` names modules imported before anything is enabled
    (so the import-time patches are in place and "nothing changed" is measurable).
    """

    id: str
    cls: str  # the issue's class: "numbers", "files", "kinds", "state", "cli", ...
    run: Callable[[Path], Any]
    raises: type[BaseException] | None = PrecisionConfigError
    names: tuple[str, ...] = ()
    check: Callable[[Any, pytest.LogCaptureFixture], None] | None = None
    enable: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    skip: Callable[[], str | None] | None = None
    exit: int = 2  # a CLI case's exit code


# -- helpers the cases use -----------------------------------------------------------------


def policy(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: PrecisionPolicy.from_dict(kw)


def scaler(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: PrecisionPolicy.from_dict({"loss_scaler": kw})


def metrics(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: PrecisionPolicy.from_dict({"metrics": kw})


def write(tmp: Path, name: str, data: bytes | str) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def apply(cfg: Any, pol: Any = None) -> Callable[[Path], Any]:
    from precision_plugin.deepspeed import apply_config

    return lambda tmp: apply_config(cfg(tmp) if callable(cfg) else cfg, pol)


STRICT = PrecisionPolicy(strictness="error")
STRICT_BF16 = PrecisionPolicy(dtype="bfloat16", strictness="error")


def gemma2(tmp: Path) -> str:
    write(tmp / "gemma", "config.json", json.dumps({"model_type": "gemma2", "dtype": "bfloat16"}))
    return str(tmp / "gemma")


def ds_initialize(config: Callable[[Path], Any] | None = None, **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        import deepspeed

        model = torch.nn.Linear(4, 4)
        if config is not None:
            kw["config"] = config(tmp)
        return deepspeed.initialize(model=model, **kw)

    return run


def fp16_refused_here() -> str | None:
    from precision_plugin.deepspeed.device import deepspeed_support

    ok = deepspeed_support().fp16
    return "DeepSpeed's accelerator runs fp16 here" if ok else None


def scaler_state(**changes: Any) -> dict[str, Any]:
    state = {
        "scale": 1024.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 400,
        "_growth_tracker": 3,
        "precision_plugin_telemetry": {"steps": 7, "skipped_steps": 2, "consecutive_skips": 1},
    }
    for key, value in changes.items():
        if value is _DROP:
            state.pop(key)
        else:
            state[key] = value
    return state


_DROP = object()


def load_scaler(state: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.scaler import make_grad_scaler

        s = make_grad_scaler(PrecisionPolicy(), "cpu")
        s.scale(torch.ones(()))  # materialise the scale tensor, as a first step does
        s.load_state_dict(state)
        return s

    return run


def scale_kept(expected: float, *, steps: int, skipped: int, warned: str | None):
    def check(s: Any, caplog: pytest.LogCaptureFixture) -> None:
        stats = s.precision_stats()
        assert stats.scale == expected
        assert (stats.steps, stats.skipped_steps) == (steps, skipped)
        if warned is not None:
            assert warned in caplog.text
        else:
            assert "precision_plugin_telemetry" not in caplog.text

    return check


def telemetry(**counters: Any) -> dict[str, Any]:
    base = {"steps": 7, "skipped_steps": 2, "consecutive_skips": 1}
    for key, value in counters.items():
        if value is _DROP:
            base.pop(key)
        else:
            base[key] = value
    return scaler_state(precision_plugin_telemetry=base)


class _FullStdout(io.StringIO):
    """stdout on a full disk (``> /dev/full``)."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


def cli(*args: str | Callable[[Path], str], stdout: str | None = None) -> Callable[[Path], Any]:
    """Run the CLI in-process; ``stdout`` "full" or "closed" stands for ``> /dev/full`` and
    ``>&-``."""

    def run(tmp: Path) -> Any:
        argv = [a(tmp) if callable(a) else a for a in args]
        if stdout is None:
            return main(argv)
        saved = sys.stdout
        sys.stdout = _FullStdout() if stdout == "full" else None  # type: ignore[assignment]
        try:
            return main(argv)
        finally:
            sys.stdout = saved

    run.is_cli = True  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from precision_plugin.probe.tiny_model import save_default_model

    return Path(save_default_model(tmp_path_factory.mktemp("tiny")))


_CHECKPOINT: list[Path] = []


def broken_model(**config_changes: Any) -> Callable[[Path], str]:
    """A copy of the embedded tiny checkpoint with ``config.json`` changed."""

    def make(tmp: Path) -> str:
        dest = tmp / "model"
        shutil.copytree(_CHECKPOINT[0], dest)
        cfg = json.loads((dest / "config.json").read_text())
        cfg.update(config_changes)
        (dest / "config.json").write_text(json.dumps(cfg))
        return str(dest)

    return make


def model_with_nan_weight(name: str) -> Callable[[Path], str]:
    """A copy of the embedded tiny checkpoint whose weight ``name`` holds one NaN."""

    def make(tmp: Path) -> str:
        from safetensors.torch import load_file, save_file

        dest = Path(broken_model()(tmp))
        weights = dest / "model.safetensors"
        state = load_file(str(weights))
        state[name][0, 0] = float("nan")
        save_file(state, str(weights), metadata={"format": "pt"})
        return str(dest)

    return make


def no_cuda_only() -> str | None:
    return "a CUDA device is present" if torch.cuda.is_available() else None


def training_args(**kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from transformers import TrainingArguments

        return TrainingArguments(output_dir=str(tmp / "out"), report_to=[], **kw)

    return run


def accelerator(**kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(True)
        try:
            return Accelerator(cpu=True, **kw)
        finally:
            AcceleratorState._reset_state(True)

    return run


def fp16_linear() -> torch.nn.Module:
    return torch.nn.Linear(2, 2).to(torch.float16)


def prepare_strict(tmp: Path) -> Any:
    model = fp16_linear()
    try:
        pp.prepare_model(model, STRICT)
    finally:
        assert model.weight.dtype == torch.float16  # nothing was cast
    return model


# -- the surfaces added since (issue 20): verl, HFRollout, telemetry, overflow, prompt files,
# sanity options, metrics, CLI output; and wrong kinds of object anywhere ---------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())


IDS = torch.zeros(1, 2)


def overflow_api(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core import overflow

        return getattr(overflow, name)(*[a() if callable(a) else a for a in args], **kw)

    return run


def verl_api(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin import verl

        return getattr(verl, name)(*args, **kw)

    return run


NO_VLLM = {"vllm_version": None, "gpu_capability": None}
VERL_CFG = {"actor_rollout_ref": {"rollout": {"dtype": "???", "calculate_log_probs": True}}}


def fake_trainer(**args: Any) -> Any:
    """What HFRollout's boundary reads of the trainer calling it."""
    import types

    settings = {"temperature": 1.0, "max_completion_length": 8, **args}
    return types.SimpleNamespace(
        args=types.SimpleNamespace(**settings),
        state=types.SimpleNamespace(global_step=0),
        accelerator=None,
    )


def rollout(*args: Any, **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.trl import HFRollout

        return HFRollout(*args, **kw)

    return run


def rollout_call(prompts: Any, trainer: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.trl import HFRollout

        return HFRollout("float32")(prompts, trainer)

    return run


def telemetry_shapes(tmp: Path) -> Any:
    """TRL's tensors of different shapes inside the loss step (class 8)."""
    import types

    from precision_plugin.trl import telemetry

    trainer = types.SimpleNamespace(model=types.SimpleNamespace(training=True))
    inputs = {
        "sampling_per_token_logps": torch.full((2, 3), -0.5),
        "old_per_token_logps": torch.full((2, 4), -0.4),
        "completion_mask": torch.ones(2, 3),
    }
    loss = telemetry.compute_loss(PrecisionPolicy(), lambda *a: 1.5, trainer, None, inputs)
    return loss, telemetry.flush(trainer)


def loss_kept_metric_skipped(result: Any, caplog: pytest.LogCaptureFixture) -> None:
    loss, metrics = result
    assert loss == 1.5 and metrics == {}
    assert caplog.text.count("mismatch telemetry") == 1 and "training goes on" in caplog.text


def prompts_file(name: str, data: bytes | str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.probe import read_prompts_file

        return read_prompts_file(str(write(tmp, name, data)))

    return run


def returns(expected: Any) -> Callable[[Any, pytest.LogCaptureFixture], None]:
    def check(result: Any, caplog: pytest.LogCaptureFixture) -> None:
        assert result == expected, result

    return check


def sanity_config(**kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin.sanity import SanityConfig

        return SanityConfig(**kw)

    return run


def mismatch_api(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin._core.metrics import mismatch

        return getattr(mismatch, name)(*args, **kw)

    return run


def probe_api(name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from precision_plugin import probe

        return getattr(probe, name)(*args, **kw)

    return run


def zero_probability_is_a_problem(result: Any, caplog: pytest.LogCaptureFixture) -> None:
    from precision_plugin._core.metrics.mismatch import verdict

    assert result.tokens == 2 and result.k3_kl == INF
    assert verdict(result)[0] == "problem"


def long_prompt(tmp: Path) -> str:
    return str(write(tmp, "long.txt", "hello " * 3000 + "\n"))


NEW_SURFACES: list[Case] = [
    # verl: overrides() and check_config()
    Case(
        "overrides vllm_version banana",
        "verl",
        verl_api("overrides", vllm_version="banana", gpu_capability=None),
        names=("'vllm_version'", "banana", "version number"),
    ),
    Case(
        "overrides gpu_capability '9.0'",
        "verl",
        verl_api("overrides", vllm_version="0.10.1", gpu_capability="9.0"),
        names=("'gpu_capability'", "(major, minor)"),
    ),
    Case(
        "overrides gpu_capability (9,)",
        "verl",
        verl_api("overrides", vllm_version="0.10.1", gpu_capability=(9,)),
        names=("'gpu_capability'",),
    ),
    Case(
        "overrides verl_version",
        "verl",
        verl_api("overrides", verl_version="latest", **NO_VLLM),
        names=("'verl_version'", "latest"),
    ),
    Case(
        "overrides strategy",
        "verl",
        verl_api("overrides", strategy="deepspeed", **NO_VLLM),
        names=("'strategy'", "'fsdp'"),
    ),
    Case("overrides policy 5", "verl", verl_api("overrides", 5), names=("'policy'",)),
    Case(
        "check_config None",
        "verl",
        verl_api("check_config", None, STRICT),
        names=("'cfg'", "is nothing"),
    ),
    Case(
        "check_config a path",
        "verl",
        verl_api("check_config", "ppo_trainer.yaml", STRICT),
        names=("'cfg'", "OmegaConf.load"),
    ),
    Case("check_config {}", "verl", verl_api("check_config", {}, STRICT), names=("is empty",)),
    Case(
        "check_config a section",
        "verl",
        verl_api("check_config", {"rollout": {"dtype": "bfloat16"}}, STRICT),
        names=("actor_rollout_ref", "a section of it", "rollout"),
    ),
    Case("check_config a list", "verl", verl_api("check_config", [1], STRICT), names=("'cfg'",)),
    Case(
        "check_config dtype ???",
        "messages",
        verl_api("check_config", VERL_CFG, STRICT, verl_version="0.9.1"),
        raises=PrecisionMismatchError,
        names=("actor_rollout_ref.rollout.dtype is not set", "'???'"),
    ),
    Case(
        "check_config strategy",
        "verl",
        verl_api("check_config", VERL_CFG, strategy="ddp"),
        names=("'strategy'", "ddp"),
    ),
    Case(
        "check_config verl_version",
        "verl",
        verl_api("check_config", VERL_CFG, verl_version="v-next"),
        names=("'verl_version'",),
    ),
    Case("layout strategy", "verl", verl_api("layout", "0.9.1", "fsdp3"), names=("'strategy'",)),
    Case(
        "cli verl-overrides version",
        "cli",
        cli("verl-overrides", "--verl-version", "banana"),
        names=("verl_version", "banana"),
    ),
    # HFRollout: its arguments, and the generation settings of the trainer calling it
    Case("HFRollout fp8", "rollout", rollout("fp8"), names=("'dtype'", "fp8")),
    Case("HFRollout seed -1", "rollout", rollout(seed=-1), names=("'seed'", ">= 0")),
    Case("HFRollout policy 5", "rollout", rollout(policy=5), names=("'policy'",)),
    Case(
        "HFRollout swapped arguments",
        "rollout",
        rollout_call(fake_trainer(), ["hello"]),
        names=("'prompts'", "SimpleNamespace"),
    ),
    Case(
        "HFRollout temperature 0",
        "rollout",
        rollout_call(["hello"], fake_trainer(temperature=0)),
        names=("temperature=0", "> 0"),
    ),
    Case(
        "HFRollout temperature nan",
        "rollout",
        rollout_call(["hello"], fake_trainer(temperature=NAN)),
        names=("temperature=nan",),
    ),
    Case(
        "HFRollout max_completion_length 0",
        "rollout",
        rollout_call(["hello"], fake_trainer(max_completion_length=0)),
        names=("max_completion_length=0", ">= 1"),
    ),
    Case(
        "HFRollout no trainer",
        "rollout",
        rollout_call(["hello"], object()),
        names=("'trainer'", "rollout_func"),
    ),
    # TRL telemetry: a problem is one warning and a skipped metric, never a stopped loss step
    Case(
        "telemetry shapes",
        "telemetry",
        telemetry_shapes,
        raises=None,
        check=loss_kept_metric_skipped,
    ),
    Case(
        "alias_metrics None",
        "telemetry",
        lambda t: __import__("precision_plugin.trl", fromlist=["x"]).alias_metrics(None),
        names=("'logs'",),
    ),
    # the overflow API
    Case(
        "headroom margin -1",
        "overflow",
        overflow_api("headroom", _model, IDS, margin_bits=-1),
        names=("'margin_bits'", "[0, 16]"),
    ),
    Case(
        "headroom margin nan",
        "overflow",
        overflow_api("headroom", _model, IDS, margin_bits=NAN),
        names=("'margin_bits'", "finite"),
    ),
    Case(
        "headroom batches None",
        "overflow",
        overflow_api("headroom", _model, None),
        names=("'batches'", "NoneType"),
    ),
    Case(
        "headroom no batch",
        "overflow",
        overflow_api("headroom", _model, []),
        names=("'batches'", "no batch"),
    ),
    Case(
        "headroom model None",
        "overflow",
        overflow_api("headroom", None, IDS),
        names=("'model'", "torch.nn.Module"),
    ),
    Case(
        "OverflowDetector every 0",
        "overflow",
        overflow_api("OverflowDetector", _model, every=0),
        names=("'every'", "detect_every"),
    ),
    Case(
        "OverflowDetector strictness",
        "overflow",
        overflow_api("OverflowDetector", _model, strictness="strict"),
        names=("'strictness'", "'warn', 'error'"),
    ),
    Case(
        "OverflowDetector mode",
        "overflow",
        overflow_api("OverflowDetector", _model, mode="on"),
        names=("'mode'", "'sampled'"),
    ),
    Case(
        "keep_fp32_modules a string",
        "overflow",
        overflow_api("keep_fp32_modules", _model, "lm_head"),
        names=("'patterns'", "one character at a time", "['lm_head']"),
    ),
    Case(
        "keep_fp32_modules no match",
        "overflow",
        overflow_api("keep_fp32_modules", _model, ["nosuch"]),
        names=("'nosuch'", "matches no module"),
    ),
    Case(
        "keep_fp32_modules blank",
        "overflow",
        overflow_api("keep_fp32_modules", _model, ["  "]),
        names=("'patterns'", "non-empty"),
    ),
    Case(
        "match_modules 5",
        "overflow",
        overflow_api("match_modules", _model, 5),
        names=("'patterns'",),
    ),
    Case(
        "fp16_margin_bits text",
        "overflow",
        overflow_api("fp16_margin_bits", "big"),
        names=("'max_abs'",),
    ),
    Case("recommend None", "overflow", overflow_api("recommend", None), names=("'report'",)),
    # probe prompt files: read as the user meant, or refused
    Case(
        "prompts JSONL with BOM",
        "prompts",
        prompts_file("p.jsonl", b'\xef\xbb\xbf{"prompt": "Hi"}\n{"prompt": "Yo"}\n'),
        raises=None,
        check=returns(["Hi", "Yo"]),
    ),
    Case(
        "prompts JSON array",
        "prompts",
        prompts_file("p.json", '[\n  "Hi",\n  {"prompt": "Yo"}\n]\n'),
        raises=None,
        check=returns(["Hi", "Yo"]),
    ),
    Case(
        "prompts broken JSON array",
        "prompts",
        prompts_file("p.json", '[\n  "Hi",\n  "Yo"\n'),
        names=("looks like a JSON array",),
    ),
    Case(
        "prompts JSON array of numbers",
        "prompts",
        prompts_file("p.json", "[1, 2]"),
        names=("item 1", "no usable prompt"),
    ),
    Case(
        "prompts text starting with [",
        "prompts",
        prompts_file("p.txt", "[INST] Hi [/INST]\n"),
        raises=None,
        check=returns(["[INST] Hi [/INST]"]),
    ),
    Case("prompts path ''", "prompts", probe_api("read_prompts_file", ""), names=("'path'",)),
    Case("cli prompts ''", "cli", cli("probe", "--prompts", ""), names=("--prompts", "empty")),
    Case("cli plot ''", "cli", cli("probe", "--plot", ""), names=("--plot", "empty")),
    Case("cli json ''", "cli", cli("probe", "--json", ""), names=("--json", "empty")),
    Case(
        "cli prompt longer than the model",
        "messages",
        cli("probe", "--prompts", long_prompt, "--dtypes", "float32"),
        names=("prompt 1 is", "max_position_embeddings=2048", "shorten it"),
    ),
    # sanity options
    Case(
        "sanity learning_rate nan",
        "sanity",
        sanity_config(learning_rate=NAN),
        names=("'learning_rate'", "finite"),
    ),
    Case(
        "sanity temperature 0",
        "sanity",
        sanity_config(temperature=0.0),
        names=("'temperature'", "> 0"),
    ),
    Case("sanity steps True", "sanity", sanity_config(steps=True), names=("'steps'", "bool")),
    Case(
        "sanity unknown option",
        "sanity",
        lambda t: __import__("precision_plugin.sanity", fromlist=["x"]).preset_config(colour=1),
        names=("colour",),
    ),
    Case(
        "sanity run a dict",
        "sanity",
        lambda t: __import__("precision_plugin.sanity", fromlist=["x"]).run_sanity({"steps": 1}),
        names=("'config'", "SanityConfig"),
    ),
    Case("cli sanity steps 0", "cli", cli("sanity", "--steps", "0"), names=("--steps",)),
    # impossible metric inputs
    Case(
        "mismatch probabilities",
        "metrics",
        mismatch_api("compute_mismatch", [[0.5, 0.25]], [[0.5, 0.3]]),
        names=("'train_logprobs'", "above 0", "probabilities"),
    ),
    Case(
        "mismatch -inf learner",
        "metrics",
        mismatch_api("compute_mismatch", [[-INF, -0.1]], [[-0.1, -0.1]]),
        raises=None,
        check=zero_probability_is_a_problem,
    ),
    Case(
        "metrics_from_sums short",
        "metrics",
        mismatch_api("metrics_from_sums", torch.zeros(3), torch.zeros(1)),
        names=("'sums'", f"({len(SUM_FIELDS)},)"),
    ),
    Case(
        "verdict bad settings",
        "metrics",
        lambda t: __import__("precision_plugin._core.metrics.mismatch", fromlist=["x"]).verdict(
            __import__("precision_plugin._core.metrics.mismatch", fromlist=["x"]).compute_mismatch(
                [-0.1], [-0.1]
            ),
            {"prob_diff_ok": -1},
        ),
        names=("'settings'", "prob_diff_ok"),
    ),
    Case(
        "measure ragged sides",
        "metrics",
        probe_api("measure", [[-0.1]], [[-0.1, -0.2]]),
        names=("'train'", "'rollout'", "different lengths"),
    ),
    # CLI output and signals
    Case(
        "cli stdout full",
        "output",
        cli("verl-overrides", stdout="full"),
        names=("cannot write the output", "No space left"),
        exit=74,
    ),
    Case(
        "cli stdout closed",
        "output",
        cli("doctor", "--json", stdout="closed"),
        names=("cannot write the output", "stdout is closed"),
        exit=74,
    ),
    Case(
        "cli probe stdout closed",
        "output",
        cli("probe", stdout="closed"),
        names=("no --json FILE", "results would be lost"),
        exit=74,
    ),
    # OpenRLHF and SGLang: checks that would find nothing in the wrong kind of object
    Case(
        "openrlhf check_args 5",
        "kinds",
        lambda t: __import__("precision_plugin.openrlhf", fromlist=["x"]).check_args(5, STRICT),
        names=("'args'", "parse_args"),
    ),
    Case(
        "areal config a path",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).check_areal_config(
            "areal.yaml", STRICT
        ),
        names=("'cfg'", "not a path"),
    ),
    Case(
        "areal config nothing to check",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).check_areal_config(
            {"experiment_name": "x"}, STRICT
        ),
        names=("'cfg'", "nothing to check"),
    ),
    Case(
        "sglang verify_server not a URL",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).verify_server("x"),
        names=("'url'", "http://localhost:30000"),
    ),
    Case(
        "slime argv None",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).check_slime_args(None),
        names=("'argv'", "NoneType"),
    ),
    Case(
        "sglang argv flag without its value",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).check_server_args(
            ["--model-path", "/m", "--dtype"], STRICT
        ),
        names=("argument --dtype: expected one argument", "exactly as launched"),
    ),
    Case(
        "slime argv flag without its value",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).check_slime_args(
            ["--fp16", "--sglang-dtype"], STRICT
        ),
        names=("argument --sglang-dtype: expected one argument",),
    ),
    Case(
        "sglang verify_server JSON without dtype",
        "kinds",
        lambda t: __import__("precision_plugin.sglang", fromlist=["x"]).verify_server(
            {"model_path": "/m"}, STRICT
        ),
        names=("'url'", "no 'dtype' key"),
    ),
    Case(
        "openrlhf tensor parallel size a word",
        "numbers",
        lambda t: __import__("precision_plugin.openrlhf", fromlist=["x"]).check_args(
            {"ds.param_dtype": "fp16", "ds.tensor_parallel_size": "two"}, STRICT
        ),
        names=("(--ds.tensor_parallel_size)", "is 'two'", "integer"),
    ),
    # the wrong kind of object anywhere: one line naming the parameter, no raw TypeError
    Case(
        "prepare_model swapped",
        "types",
        lambda t: pp.prepare_model("float16", _model()),
        names=("'model'", "str 'float16'"),
    ),
    Case(
        "engine_kwargs swapped",
        "types",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs(
            "float16", {"model": "m"}
        ),
        names=("'kwargs'",),
    ),
    Case(
        "cascade_decision capability text",
        "types",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).cascade_decision(
            "0.10.1", "8.0"
        ),
        names=("'capability'",),
    ),
    Case(
        "skip_adapters items",
        "types",
        lambda t: pp.enable(skip_adapters=["trl", 3]),
        names=("'skip_adapters'", "item [1] is int 3"),
    ),
    Case(
        "unknown keyword",
        "types",
        overflow_api("headroom", _model, IDS, margin=2),
        names=("'margin'", "Did you mean 'margin_bits'"),
    ),
    Case(
        "missing argument",
        "types",
        overflow_api("headroom", _model),
        names=("'batches'", "headroom(model, batches"),
    ),
    Case(
        "check_model_config path None",
        "types",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).check_model_config(None),
        names=("'path_or_dict'",),
    ),
    Case(
        "Patcher setenv value",
        "types",
        lambda t: (
            __import__("precision_plugin._base.patching", fromlist=["x"])
            .Patcher()
            .setenv("PP_X", 5, reason="test")
        ),
        names=("'value'", "int 5"),
    ),
]


def api(module: str, name: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    """``precision_plugin.<module>.<name>(*args, **kw)``; a callable argument is built first."""

    def run(tmp: Path) -> Any:
        import importlib

        target = getattr(importlib.import_module(f"precision_plugin.{module}"), name)
        return target(*[a() if callable(a) else a for a in args], **kw)

    return run


def refused_connection_asks_for_a_server(result: Any, caplog: pytest.LogCaptureFixture) -> None:
    (finding,) = result
    assert finding.status == "warning", finding
    assert "Is a vLLM server running at http://127.0.0.1:9? Start it first" in finding.message
    assert "DEV_MODE" not in finding.message + finding.fix


def dtype_is(expected: str) -> Callable[[Any, pytest.LogCaptureFixture], None]:
    def check(result: Any, caplog: pytest.LogCaptureFixture) -> None:
        assert result.dtype == expected, result.dtype

    return check


DUPLICATE_FP16 = '{"fp16": {"enabled": true}, "fp16": {"enabled": false}}'

#: The audit of issues 20/21 as a new user: classes found outside the catalogue above (inputs
#: that must agree with each other, values a validator read too generously, parameters typed
#: Any, server URLs, objects holding nothing to check, JSON read last-key-wins).
AUDIT_SURFACES: list[Case] = [
    # parameters that must agree with each other: one error naming both, at the boundary
    Case(
        "drift_fit lengths and sums differ",
        "metrics",
        mismatch_api("drift_fit", [4, 8, 16], [0.1, 0.2]),
        names=("arguments 'lengths' and 'sums' differ in length (lengths: 3, sums: 2)",),
    ),
    Case(
        "drift_per_1k text",
        "metrics",
        mismatch_api("drift_per_1k", "abc", "def"),
        names=("'lengths'", "not a list of numbers"),
    ),
    Case(
        "drift_fit negative length",
        "metrics",
        mismatch_api("drift_fit", [-5, 3], [0.1, 0.1]),
        names=("'lengths'", "holds -5", ">= 0"),
    ),
    Case(
        "fit_growth lists differ",
        "metrics",
        api("_core.metrics.consequence", "fit_growth", [0.1, 0.2], [4]),
        names=("'seq_log_ratio' and 'seq_lengths' differ in length",),
    ),
    Case(
        "fit_growth negative length",
        "metrics",
        api("_core.metrics.consequence", "fit_growth", [0.1, 0.2], [4, -1]),
        names=("'seq_lengths'", "has -1 at [1]"),
    ),
    Case(
        "consequence_from_sums short",
        "metrics",
        api("_core.metrics.consequence", "consequence_from_sums", torch.zeros(1), torch.zeros(2)),
        names=("'counts'", "consequence_sums()"),
    ),
    Case(
        "mismatch mask shape",
        "metrics",
        mismatch_api("mismatch_sums", [[-0.1, -0.2]], [[-0.1, -0.2]], [[1]]),
        names=("'mask' differ in shape", "mask: (1, 1)"),
    ),
    # values a validator read too generously
    Case(
        "mismatch mask of weights",
        "metrics",
        mismatch_api("compute_mismatch", [[-0.1, -0.2]], [[-0.1, -0.3]], [[2, 1]]),
        names=("'mask'", "holds 2", "0/1 or bool"),
    ),
    Case(
        "consequence mask NaN",
        "metrics",
        api(
            "_core.metrics.consequence",
            "compute_consequence",
            [[-0.1, -0.2]],
            [[-0.1, -0.3]],
            [[NAN, 1]],
        ),
        names=("'mask'", "holds nan"),
    ),
    Case(
        "aliases_for VERL",
        "metrics",
        mismatch_api("aliases_for", "VERL"),
        names=("'system'", "did you mean 'verl'?"),
    ),
    Case(
        "fp16_margin_bits negative",
        "overflow",
        overflow_api("fp16_margin_bits", -1.0),
        names=("'max_abs'", "negative"),
    ),
    Case(
        "match_modules a set",
        "overflow",
        overflow_api("match_modules", _model, {"0"}),
        names=("'patterns'", "got set", "a list of str"),
    ),
    Case(
        "headroom batch of ints",
        "overflow",
        overflow_api("headroom", _model, torch.ones(1, 2, dtype=torch.long)),
        names=("'batches'", "forward failed on batch 0", "same dtype"),
    ),
    Case(
        "headroom keyword batch",
        "overflow",
        overflow_api("headroom", _model, {"input_ids": torch.ones(1, 2)}),
        names=("'batches'", "unexpected keyword argument 'input_ids'", "model(**batch)"),
    ),
    # parameters typed Any: validated, not a raw AttributeError deep inside
    Case(
        "cast_model None",
        "types",
        api("_core.buffers", "cast_model", None, "float16"),
        names=("'model'", "torch.nn.Module"),
    ),
    Case(
        "cast_model device gpu0",
        "types",
        api("_core.buffers", "cast_model", _model, "float16", "gpu0"),
        names=("'device'", "not a torch device"),
    ),
    Case(
        "buffer_dtypes 5",
        "types",
        api("_core.buffers", "buffer_dtypes", 5),
        names=("'model'", "torch.nn.Module"),
    ),
    Case(
        "keep_float32_buffers a string",
        "types",
        api("buffers", "keep_float32_buffers", "model"),
        names=("'model'",),
    ),
    Case(
        "audit_run forward_dtype 3",
        "types",
        api("audit", "audit_run", PrecisionPolicy(), None, None, forward_dtype=3),
        names=("'forward_dtype'", "is not a dtype"),
    ),
    Case(
        "engine_kwargs fields",
        "types",
        api("vllm", "engine_kwargs", {"model": "m"}, fields="dtype"),
        names=("'fields'", "EngineArgs field names"),
    ),
    Case(
        "HFRollout torch dtype",
        "rollout",
        rollout(dtype=torch.float16),
        raises=None,
        check=dtype_is("float16"),  # as enable() and PrecisionPolicy take it
    ),
    Case(
        "HFRollout dtype 5",
        "rollout",
        rollout(dtype=5),
        names=("'dtype'", "a str, a torch.dtype or None"),
    ),
    # server URLs: one check for vLLM and SGLang, before any request
    Case(
        "vllm verify_server port text",
        "kinds",
        api("vllm", "verify_server", "http://h:abc"),
        names=("'server'", "not a server URL", "Port could not be cast"),
    ),
    Case(
        "vllm verify_server no scheme",
        "kinds",
        api("vllm", "verify_server", "localhost:8000"),
        names=("'server'", "no http:// or https:// scheme", "http://localhost:8000"),
    ),
    Case(
        "sglang verify_server IPv6",
        "kinds",
        api("sglang", "verify_server", "http://[::1"),
        names=("'url'", "Invalid IPv6 URL"),
    ),
    Case(
        "sglang verify_server port range",
        "kinds",
        api("sglang", "verify_server", "http://127.0.0.1:99999"),
        names=("'url'", "Port out of range"),
    ),
    Case(
        "vllm verify_server refused",
        "kinds",
        api("vllm", "verify_server", "http://127.0.0.1:9"),
        raises=None,
        check=refused_connection_asks_for_a_server,
    ),
    # objects that hold nothing to check
    Case(
        "vllm verify_server {}",
        "kinds",
        api("vllm", "verify_server", {}),
        names=("'server'", "has no 'vllm_config' or 'model_config' key", "nothing to check"),
    ),
    Case(
        "sglang verify_server no dtype",
        "kinds",
        api("sglang", "verify_server", {"model_path": "m"}),
        names=("'url'", "has no 'dtype' key"),
    ),
    Case(
        "openrlhf check_args {}",
        "kinds",
        api("openrlhf", "check_args", {}),
        names=("'args'", "holds none of OpenRLHF's arguments", "parse_args(argv)"),
    ),
    Case(
        "sglang check_server_args {}",
        "kinds",
        api("sglang", "check_server_args", {}),
        names=("'args'", "is empty", "nothing to check"),
    ),
    Case(
        "sglang auto_dtype 5",
        "kinds",
        api("sglang", "auto_dtype", {"torch_dtype": 5}),
        names=("auto_dtype()", "declares dtype 5", "no dtype name"),
    ),
    # JSON a user writes: a key twice is an error, not the last one winning
    Case(
        "env duplicate key",
        "env",
        lambda t: pp.enable(),
        env={"PRECISION_PLUGIN": '{"dtype": "float16", "dtype": "bfloat16"}'},
        names=("PRECISION_PLUGIN", "'dtype' appears twice", "'float16' and then 'bfloat16'"),
    ),
    Case(
        "ds duplicate key",
        "files",
        apply(lambda t: str(write(t, "dup.json", DUPLICATE_FP16))),
        names=("dup.json", "'fp16' appears twice", "DeepSpeed refuses such a config"),
    ),
    Case(
        "prompts duplicate key",
        "prompts",
        prompts_file("p.jsonl", '{"prompt": "a", "prompt": "b"}\n'),
        names=("line 1", "'prompt' appears twice"),
    ),
]


# -- the catalogue -----------------------------------------------------------------------------

#: Issue 30: meaning, not type (other programs' configs by their own rules, server answers,
#: files and streams, deep structures, generation settings, progress): tests/unit/catalogue_meaning.py
MEANING_SURFACES: list[Case] = [Case(**row) for row in _meaning_rows(sys.modules[__name__])]

#: Issue 52, classes 1-2: files that are not plain files or too big, paths the OS refuses; each
#: run in a forked child with a memory cap and a time limit (a hang fails, never hangs):
#: tests/unit/catalogue_files.py
FILE_SURFACES: list[Case] = [Case(**row) for row in _file_rows(sys.modules[__name__])]

#: Issue 52, classes 3-5: numbers outside their domain, sequences that do not pair up,
#: non-finite values certified: tests/unit/catalogue_numbers.py
NUMBER_SURFACES: list[Case] = [Case(**row) for row in _number_rows(sys.modules[__name__])]

#: Issue 52, classes 7-9: each refusal the docs promise through the public calls (enable(), the
#: callback, the DeepSpeed entry, the CLI), the API refusing what the CLI refuses, one dtype
#: however spelled: tests/unit/catalogue_public.py
PUBLIC_SURFACES: list[Case] = [Case(**row) for row in _public_rows(sys.modules[__name__])]

CASES: list[Case] = [
    # 1. numbers that validate but cannot work; wrong types and values of the policy
    Case("dtype fp8", "policy", policy(dtype="fp8"), names=("dtype", "fp8")),
    Case("dtype None", "policy", lambda t: PrecisionPolicy(dtype=None), names=("dtype",)),
    Case("dtype auto", "policy", policy(dtype="auto"), names=("dtype", "auto")),
    Case("strictness typo", "policy", policy(strictness="strict"), names=("strictness",)),
    Case("misspelled key", "policy", policy(dtyp="float16"), names=("Did you mean 'dtype'",)),
    Case("init_scale inf", "numbers", scaler(init_scale=INF), names=("loss_scaler.init_scale",)),
    Case("init_scale nan", "numbers", scaler(init_scale=NAN), names=("loss_scaler.init_scale",)),
    Case("init_scale > fp32", "numbers", scaler(init_scale=1e39), names=("init_scale", "float32")),
    Case("init_scale < fp32", "numbers", scaler(init_scale=1e-40), names=("init_scale",)),
    Case("init_scale negative", "numbers", scaler(init_scale=-1.0), names=("init_scale",)),
    Case("init_scale text", "policy", scaler(init_scale="big"), names=("init_scale", "number")),
    Case("init_scale bool", "policy", scaler(init_scale=True), names=("init_scale",)),
    Case("init_scale huge int", "numbers", scaler(init_scale=10**400), names=("init_scale",)),
    Case(
        "growth_interval 1e30",
        "numbers",
        scaler(growth_interval=10**30),
        names=("loss_scaler.growth_interval", "64-bit"),
    ),
    Case("growth_interval 0", "numbers", scaler(growth_interval=0), names=("growth_interval",)),
    Case("growth_interval 1.5", "policy", scaler(growth_interval=1.5), names=("integer",)),
    Case("growth_factor 1", "numbers", scaler(growth_factor=1.0), names=("growth_factor",)),
    Case("growth_factor inf", "numbers", scaler(growth_factor=INF), names=("growth_factor",)),
    Case("growth_factor 1e300", "numbers", scaler(growth_factor=1e300), names=("growth_factor",)),
    Case("backoff 1e-50", "numbers", scaler(backoff_factor=1e-50), names=("backoff_factor",)),
    Case("backoff 1.5", "numbers", scaler(backoff_factor=1.5), names=("backoff_factor",)),
    Case("min_scale 0", "numbers", scaler(min_scale=0.0), names=("min_scale",)),
    Case("min_scale denormal", "numbers", scaler(min_scale=1e-45), names=("min_scale",)),
    Case(
        "min_scale > init", "numbers", scaler(min_scale=4.0, init_scale=2.0), names=("min_scale",)
    ),
    Case("hysteresis 1e30", "numbers", scaler(hysteresis=10**30), names=("hysteresis",)),
    Case("max_skips 0", "numbers", scaler(max_skips_at_min=0), names=("max_skips_at_min",)),
    Case("on_min_scale stop", "policy", scaler(on_min_scale="stop"), names=("on_min_scale",)),
    Case("enabled yes", "policy", scaler(enabled="yes"), names=("enabled", "true or false")),
    Case(
        "prob_diff_bad -1",
        "messages",
        metrics(prob_diff_bad=-1),
        names=("metrics.prob_diff_bad",),
    ),
    Case("prob_diff_ok > bad", "numbers", metrics(prob_diff_ok=0.5), names=("prob_diff_ok",)),
    Case("prob_diff_ok inf", "numbers", metrics(prob_diff_ok=INF), names=("prob_diff_ok",)),
    Case("k3_max nan", "numbers", metrics(self_check_k3_max=NAN), names=("self_check_k3_max",)),
    Case("log_every 0", "numbers", metrics(log_every=0), names=("log_every",)),
    Case(
        "cascade_guard typo",
        "policy",
        lambda t: PrecisionPolicy.from_dict({"vllm": {"cascade_guard": "sometimes"}}),
        names=("vllm.cascade_guard",),
    ),
    Case("section a list", "kinds", policy(vllm=["off"]), names=("vllm",)),
    Case("from_dict a str", "kinds", lambda t: PrecisionPolicy.from_dict("fp16"), names=("dict",)),
    Case(
        "section an int", "kinds", lambda t: PrecisionPolicy(loss_scaler=5), names=("loss_scaler",)
    ),
    # PRECISION_PLUGIN
    Case(
        "env fp8",
        "env",
        lambda t: pp.enable(),
        env={"PRECISION_PLUGIN": "fp8"},
        names=("PRECISION_PLUGIN='fp8'",),
    ),
    Case(
        "env broken json",
        "env",
        lambda t: pp.enable(),
        env={"PRECISION_PLUGIN": "{dtype"},
        names=("PRECISION_PLUGIN", "JSON"),
    ),
    Case(
        "env json inf",
        "numbers",
        lambda t: pp.enable(),
        env={"PRECISION_PLUGIN": '{"loss_scaler": {"init_scale": 1e400}}'},
        names=("PRECISION_PLUGIN", "init_scale"),
    ),
    Case(
        "env unknown key",
        "env",
        lambda t: pp.enable(),
        env={"PRECISION_PLUGIN": '{"dtype": "fp16", "x": 1}'},
        names=("x",),
    ),
    Case(
        "env list",
        "env",
        lambda t: pp.enable(),
        env={"PRECISION_PLUGIN": '["fp16"]'},
        names=("PRECISION_PLUGIN",),
    ),
    Case(
        "env callback",
        "env",
        lambda t: pp.PrecisionCallback().policy,
        env={"PRECISION_PLUGIN": "int8"},
        names=("PRECISION_PLUGIN='int8'",),
    ),
    # enable() / disable()
    Case("enable int8", "enable", lambda t: pp.enable(dtype="int8"), names=("dtype",)),
    Case("enable policy 5", "kinds", lambda t: pp.enable(5), names=("enable()",)),
    Case("enable list", "kinds", lambda t: pp.enable([("dtype", "fp16")]), names=("enable()",)),
    Case(
        "skip_adapters 5", "kinds", lambda t: pp.enable(skip_adapters=5), names=("skip_adapters",)
    ),
    Case(
        "skip unknown", "enable", lambda t: pp.enable(skip_adapters=["nosuch"]), names=("nosuch",)
    ),
    Case(
        "enable override",
        "numbers",
        lambda t: pp.enable(loss_scaler={"growth_interval": 10**30}),
        names=("growth_interval",),
    ),
    Case("enable unknown kw", "enable", lambda t: pp.enable(colour="red"), names=("colour",)),
    Case(
        "bad enable keeps previous",
        "enable",
        lambda t: pp.enable(dtype="fp8"),
        enable={"dtype": "bfloat16"},
        names=("dtype",),
    ),
    Case(
        "disable twice",
        "enable",
        lambda t: (pp.disable(), pp.disable()),
        raises=None,
        check=lambda r, c: (r == (False, False)) or pytest.fail(str(r)),
    ),
    # 4. the DeepSpeed entry: files and dicts
    Case("ds folder", "files", apply(lambda t: str(t)), names=("is a folder",)),
    Case(
        "ds latin-1",
        "files",
        apply(lambda t: str(write(t, "c.json", b'{"x": "\xe9"}'))),
        names=("not UTF-8", "c.json"),
    ),
    Case(
        "ds bad json",
        "files",
        apply(lambda t: str(write(t, "c.json", "{"))),
        names=("not valid JSON", "c.json"),
    ),
    Case(
        "ds json list",
        "files",
        apply(lambda t: str(write(t, "c.json", "[1]"))),
        names=("JSON object",),
    ),
    Case("ds missing file", "files", apply("nosuch.json"), names=("neither an existing file",)),
    Case(
        "ds dangling link",
        "files",
        apply(lambda t: (os.symlink(t / "gone", t / "l.json"), str(t / "l.json"))[1]),
        names=("l.json",),
    ),
    Case("ds config 5", "kinds", apply(5), names=("expected a dict",)),
    Case(
        "ds section str", "kinds", apply({"precision_plugin": "fp16"}), names=("precision_plugin",)
    ),
    Case(
        "ds section fp8",
        "policy",
        apply({"precision_plugin": {"dtype": "fp8"}}),
        names=("precision_plugin", "dtype"),
    ),
    Case(
        "ds section inf",
        "numbers",
        apply({"precision_plugin": {"loss_scaler": {"init_scale": INF}}}),
        names=("init_scale",),
    ),
    Case("ds fp16 true", "kinds", apply({"fp16": True}), names=("'fp16'",)),
    Case(
        "ds bf16 strict",
        "conflict",
        apply({"bf16": {"enabled": True}}, STRICT),
        raises=PrecisionMismatchError,
        names=("bf16.enabled",),
    ),
    Case(
        "ds static scale",
        "conflict",
        apply({"fp16": {"enabled": True, "loss_scale": 128}}, STRICT),
        raises=PrecisionMismatchError,
        names=("fp16.loss_scale",),
    ),
    Case(
        "ds autocast",
        "conflict",
        apply({"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}, STRICT),
        raises=PrecisionMismatchError,
        names=("torch_autocast",),
    ),
    Case(
        "ds param_dtype",
        "conflict",
        apply({"data_types": {"param_dtype": "bf16"}}, STRICT),
        raises=PrecisionMismatchError,
        names=("data_types.param_dtype",),
    ),
    Case("ds policy 5", "kinds", apply({}, 5), names=("'policy'", "a dtype name")),
    Case(
        "ds section dtype vs enable",
        "conflict",
        apply({"precision_plugin": {"dtype": "float16", "strictness": "error"}}),
        enable={"dtype": "bfloat16"},
        raises=PrecisionMismatchError,
        names=("precision_plugin.dtype",),
    ),
    Case(
        "ds translate a path",
        "kinds",
        lambda t: __import__("precision_plugin.deepspeed", fromlist=["x"]).translate(
            "c.json", None
        ),
        names=("load_config",),
    ),
    # the DeepSpeed entry: deepspeed.initialize under enable()
    Case(
        "ds.initialize folder",
        "files",
        ds_initialize(lambda t: str(t)),
        enable={},
        needs=("deepspeed",),
        names=("is a folder",),
    ),
    Case(
        "ds.initialize section fp8",
        "policy",
        ds_initialize(lambda t: {"precision_plugin": {"dtype": "fp8"}}),
        enable={},
        needs=("deepspeed",),
        names=("dtype",),
    ),
    Case(
        "ds.initialize args latin-1",
        "files",
        lambda t: __import__("deepspeed").initialize(
            args=argparse.Namespace(deepspeed_config=str(write(t, "c.json", b"\xff{"))),
            model=torch.nn.Linear(2, 2),
        ),
        enable={},
        needs=("deepspeed",),
        names=("not UTF-8",),
    ),
    Case(
        "ds.initialize fp16 on this accelerator",
        "device",
        ds_initialize(lambda t: {"train_micro_batch_size_per_gpu": 1}),
        enable={"strictness": "error"},
        needs=("deepspeed",),
        raises=PrecisionMismatchError,
        names=("accelerator does not support fp16", "bfloat16", "float32"),
        skip=fp16_refused_here,
    ),
    Case(
        "ds.initialize fp16 section on this accelerator",
        "device",
        ds_initialize(lambda t: {"fp16": {"enabled": True}}),
        enable={"strictness": "error"},
        needs=("deepspeed",),
        raises=PrecisionMismatchError,
        names=("cpu accelerator",),
        skip=fp16_refused_here,
    ),
    Case(
        "track_engine None",
        "kinds",
        lambda t: __import__("precision_plugin.deepspeed", fromlist=["x"]).track_engine(None),
        names=("track_engine()",),
    ),
    Case(
        "engine_scaler_stats obj",
        "kinds",
        lambda t: __import__("precision_plugin.deepspeed", fromlist=["x"]).engine_scaler_stats(
            object()
        ),
        names=("DeepSpeed engine",),
    ),
    # Accelerate
    Case(
        "Accelerator bf16",
        "conflict",
        accelerator(mixed_precision="bf16"),
        enable={"strictness": "error"},
        needs=("accelerate.accelerator",),
        raises=PrecisionMismatchError,
        names=("mixed_precision='bf16'",),
    ),
    Case(
        "Accelerator env bf16",
        "conflict",
        accelerator(),
        env={"ACCELERATE_MIXED_PRECISION": "bf16"},
        enable={"strictness": "error"},
        needs=("accelerate.accelerator",),
        raises=PrecisionMismatchError,
        names=("mixed_precision='bf16'",),
    ),
    Case(
        "Accelerator fp8",
        "conflict",
        accelerator(mixed_precision="fp8"),
        enable={"strictness": "error"},
        needs=("accelerate.accelerator",),
        raises=PrecisionMismatchError,
        names=("mixed_precision='fp8'",),
    ),
    Case(
        "apply_policy None",
        "kinds",
        lambda t: __import__("precision_plugin.accelerate", fromlist=["x"]).apply_policy(
            None, PrecisionPolicy()
        ),
        names=("apply_policy()", "Accelerator"),
    ),
    Case(
        "apply_policy fp8",
        "kinds",
        lambda t: __import__("precision_plugin.accelerate", fromlist=["x"]).apply_policy(
            None, "fp8"
        ),
        names=("fp8",),
    ),
    # HF / TRL
    Case(
        "args fp16+bf16",
        "messages",
        training_args(fp16=True, bf16=True),
        enable={"strictness": "error"},
        needs=("transformers.training_args",),
        raises=PrecisionMismatchError,
        names=("TrainingArguments(bf16=True)",),
    ),
    Case(
        "args bf16",
        "conflict",
        training_args(bf16=True),
        enable={"strictness": "error"},
        needs=("transformers.training_args",),
        raises=PrecisionMismatchError,
        names=("bf16=True",),
    ),
    Case(
        "args fp16 under bf16",
        "conflict",
        training_args(fp16=True),
        enable={"dtype": "bfloat16", "strictness": "error"},
        needs=("transformers.training_args",),
        raises=PrecisionMismatchError,
        names=("TrainingArguments(fp16=True)",),
    ),
    Case(
        "args fp16_full_eval",
        "conflict",
        training_args(fp16_full_eval=True),
        enable={"dtype": "bfloat16", "strictness": "error"},
        needs=("transformers.training_args",),
        raises=PrecisionMismatchError,
        names=("fp16_full_eval",),
    ),
    Case(
        "GRPOConfig bf16",
        "conflict",
        lambda t: __import__("trl").GRPOConfig(output_dir=str(t), bf16=True, report_to=[]),
        enable={"strictness": "error"},
        needs=("transformers.training_args", "trl.trainer.grpo_config"),
        raises=PrecisionMismatchError,
        names=("GRPOConfig(bf16=True)",),
    ),
    # the callback
    Case("callback fp8", "kinds", lambda t: pp.PrecisionCallback("fp8"), names=("fp8",)),
    Case("callback 5", "kinds", lambda t: pp.PrecisionCallback(5), names=("PrecisionCallback()",)),
    Case("callback 0", "kinds", lambda t: pp.PrecisionCallback(0), names=("PrecisionCallback()",)),
    Case("callback empty str", "kinds", lambda t: pp.PrecisionCallback(""), names=("dtype",)),
    Case(
        "callback unknown key",
        "kinds",
        lambda t: pp.PrecisionCallback({"dtype": "float16", "colour": 1}),
        names=("colour",),
    ),
    # master weights
    Case(
        "prepare_model None",
        "kinds",
        lambda t: pp.prepare_model(None),
        names=("prepare_model()", "NoneType"),
    ),
    Case(
        "prepare_model str", "kinds", lambda t: pp.prepare_model("gpt2"), names=("prepare_model()",)
    ),
    Case(
        "prepare_model fp8",
        "kinds",
        lambda t: pp.prepare_model(torch.nn.Linear(2, 2), "fp8"),
        names=("fp8",),
    ),
    Case(
        "check_model None",
        "kinds",
        lambda t: __import__("precision_plugin._core.master_weights", fromlist=["x"]).check_model(
            None
        ),
        names=("check_model()",),
    ),
    Case(
        "prepare_model strict",
        "conflict",
        prepare_strict,
        raises=PrecisionMismatchError,
        names=("float16 -> float32",),
    ),
    # 6. scaler state
    Case("state no scale", "state", load_scaler(scaler_state(scale=_DROP)), names=("'scale'",)),
    Case("state scale inf", "state", load_scaler(scaler_state(scale=INF)), names=("'scale'",)),
    Case("state scale text", "state", load_scaler(scaler_state(scale="big")), names=("'scale'",)),
    Case(
        "state interval text",
        "state",
        load_scaler(scaler_state(growth_interval="x")),
        names=("'growth_interval'",),
    ),
    Case(
        "state no tracker",
        "state",
        load_scaler(scaler_state(_growth_tracker=_DROP)),
        names=("'_growth_tracker'",),
    ),
    Case("state a list", "kinds", load_scaler([1024.0]), names=("load_state_dict",)),
    Case(
        "telemetry no steps",
        "state",
        load_scaler(telemetry(steps=_DROP)),
        raises=None,
        check=scale_kept(1024.0, steps=0, skipped=2, warned="'steps'"),
    ),
    Case(
        "telemetry text",
        "state",
        load_scaler(telemetry(skipped_steps="many")),
        raises=None,
        check=scale_kept(1024.0, steps=7, skipped=0, warned="'skipped_steps'"),
    ),
    Case(
        "telemetry negative",
        "state",
        load_scaler(telemetry(steps=-3)),
        raises=None,
        check=scale_kept(1024.0, steps=0, skipped=2, warned="'steps'"),
    ),
    Case(
        "telemetry a string",
        "state",
        load_scaler(scaler_state(precision_plugin_telemetry="lost")),
        raises=None,
        check=scale_kept(1024.0, steps=0, skipped=0, warned="'lost'"),
    ),
    Case(
        "telemetry absent",
        "state",
        load_scaler(scaler_state(precision_plugin_telemetry=_DROP)),
        raises=None,
        check=scale_kept(1024.0, steps=0, skipped=0, warned=None),
    ),
    Case(
        "make_grad_scaler fp8",
        "kinds",
        lambda t: __import__("precision_plugin._core.scaler", fromlist=["x"]).make_grad_scaler(
            "fp8"
        ),
        names=("fp8",),
    ),
    Case(
        "make_grad_scaler device",
        "kinds",
        lambda t: __import__("precision_plugin._core.scaler", fromlist=["x"]).make_grad_scaler(
            None, "gpu0"
        ),
        names=("device",),
    ),
    Case(
        "make_grad_scaler model",
        "kinds",
        lambda t: __import__("precision_plugin._core.scaler", fromlist=["x"]).make_grad_scaler(
            None, "cpu", model="gpt2"
        ),
        names=("model",),
    ),
    Case(
        "attach_telemetry dict",
        "kinds",
        lambda t: __import__("precision_plugin._core.scaler", fromlist=["x"]).attach_telemetry(
            torch.amp.GradScaler("cpu"), {"init_scale": 1}
        ),
        names=("LossScalerSettings",),
    ),
    # mismatch metrics
    Case(
        "mismatch shapes",
        "kinds",
        lambda t: __import__(
            "precision_plugin._core.metrics.mismatch", fromlist=["x"]
        ).compute_mismatch([[-0.1, -0.2]], [[-0.1]]),
        names=("shape",),
    ),
    Case(
        "mismatch vocab",
        "kinds",
        lambda t: __import__(
            "precision_plugin._core.metrics.mismatch", fromlist=["x"]
        ).compute_mismatch(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)),
        names=("vocab",),
    ),
    Case(
        "verdict None",
        "kinds",
        lambda t: __import__("precision_plugin._core.metrics.mismatch", fromlist=["x"]).verdict(
            None
        ),
        names=("MismatchMetrics",),
    ),
    # 10. vLLM engine_kwargs and the checks behind it
    Case(
        "engine_kwargs gemma2",
        "paths",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs(
            {"model": gemma2(t)}, version=None
        ),
        names=("gemma2", "bfloat16"),
    ),
    Case(
        "engine_kwargs gemma2 bf16",
        "paths",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs(
            {"model": gemma2(t)}, "bfloat16", version=None
        ),
        raises=None,
        check=lambda r, c: r["dtype"] == "bfloat16" or pytest.fail(str(r)),
    ),
    Case(
        "engine_kwargs bf16 strict",
        "conflict",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs(
            {"dtype": "bfloat16"}, STRICT, version=None
        ),
        raises=PrecisionMismatchError,
        names=("dtype='bfloat16'",),
    ),
    Case(
        "engine_kwargs kv strict",
        "conflict",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs(
            {"kv_cache_dtype": "bfloat16"}, STRICT, version=None
        ),
        raises=PrecisionMismatchError,
        names=("kv_cache_dtype",),
    ),
    Case(
        "engine_kwargs list",
        "kinds",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs(["model"]),
        names=("engine_kwargs()",),
    ),
    Case(
        "engine_kwargs fp8",
        "kinds",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).engine_kwargs({}, "fp8"),
        names=("fp8",),
    ),
    Case(
        "check_model_config 5",
        "kinds",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).check_model_config(5),
        names=("check_model_config",),
    ),
    Case(
        "check_model_config list",
        "files",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).check_model_config(
            write(t, "m/config.json", "[]").parent
        ),
        names=("JSON list",),
    ),
    Case(
        "check_model_config latin-1",
        "files",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).check_model_config(
            write(t, "m/config.json", b"\xff")
        ),
        names=("config.json", "not UTF-8", "byte 0xff at offset 0"),
    ),
    Case(
        "verify_engine None",
        "kinds",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).verify_engine(None),
        names=("vllm.LLM",),
    ),
    Case(
        "verify_server 5",
        "kinds",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).verify_server(5),
        names=("VLLMClient",),
    ),
    Case(
        "enforce on a dict",
        "kinds",
        lambda t: __import__("precision_plugin.vllm", fromlist=["x"]).enforce_on_engine_args(
            {"dtype": "auto"}, PrecisionPolicy()
        ),
        names=("EngineArgs",),
    ),
    # 7. the CLI: one line on stderr, exit 2, before the long part
    Case("cli seed 2**70", "cli", cli("probe", "--seed", str(2**70)), names=("seed",)),
    Case("cli seed -1", "cli", cli("probe", "--seed", "-1"), names=("--seed",)),
    Case("cli num-prompts 0", "cli", cli("probe", "--num-prompts", "0"), names=("--num-prompts",)),
    Case(
        "cli num-prompts 1e9",
        "cli",
        cli("probe", "--num-prompts", "1000000000"),
        names=("num-prompts",),
    ),
    Case("cli dtypes fp8", "cli", cli("probe", "--dtypes", "fp8"), names=("fp8",)),
    Case("cli dtypes empty", "cli", cli("probe", "--dtypes", ","), names=("names no dtype",)),
    Case("cli engine", "cli", cli("probe", "--engine", "nosuch"), names=("--engine",)),
    Case(
        "cli model missing", "cli", cli("probe", "--model", "nosuch-dir"), names=("does not exist",)
    ),
    Case(
        "cli model a file",
        "cli",
        cli("probe", "--model", lambda t: str(write(t, "f", "x"))),
        names=("is a file",),
    ),
    Case(
        "cli model no config",
        "cli",
        cli("probe", "--model", lambda t: (t / "empty").mkdir() or str(t / "empty")),
        names=("no config.json",),
    ),
    Case(
        "cli config hidden_size text",
        "cli",
        cli("probe", "--model", broken_model(hidden_size="abc")),
        names=("hidden_size",),
    ),
    Case(
        "cli config heads 0",
        "cli",
        cli("probe", "--model", broken_model(num_attention_heads=0)),
        names=("could not load",),
    ),
    Case(
        "cli config vocab -1",
        "cli",
        cli("probe", "--model", broken_model(vocab_size=-1)),
        names=("could not load",),
    ),
    # transformers loads both without a word; the rollout then failed deep inside torch
    # ("probability tensor contains either inf, nan", "upper bound and lower bound inconsistent")
    Case(
        "cli config sliding_window -5",
        "cli",
        cli("probe", "--model", broken_model(sliding_window=-5)),
        names=(
            "could not load",
            "config.json has sliding_window=-5, and a window holds at least 1",
        ),
    ),
    # accepted without a word: EOS could never be sampled, so no completion ended early
    Case(
        "cli config eos outside the vocabulary",
        "cli",
        cli("probe", "--model", broken_model(eos_token_id=99999)),
        names=("config.json has eos_token_id=99999, outside the model's 259 token ids (0 .. 258)",),
    ),
    Case(
        "cli weights with a NaN",
        "cli",
        cli("probe", "--model", model_with_nan_weight("model.layers.0.mlp.down_proj.weight")),
        names=(
            "its weights hold NaN or inf (1 value(s) in 'model.layers.0.mlp.down_proj.weight')",
        ),
    ),
    Case(
        "cli model_type qwen2",
        "cli",
        cli("probe", "--model", broken_model(model_type="qwen2")),
        names=("do not match its config.json", "qwen2"),
    ),
    Case(
        "cli model_type gpt2",
        "cli",
        cli("probe", "--model", broken_model(model_type="gpt2")),
        names=("do not match",),
    ),
    Case(
        "cli model_type unknown",
        "cli",
        cli("probe", "--model", broken_model(model_type="nosuch")),
        names=("nosuch",),
    ),
    Case(
        "cli extra layers",
        "cli",
        cli("probe", "--model", broken_model(num_hidden_layers=9)),
        names=("missing",),
    ),
    Case(
        "cli max-new-tokens",
        "cli",
        cli("probe", "--max-new-tokens", "100000"),
        names=("max_position_embeddings",),
    ),
    Case(
        "cli target-length 0",
        "cli",
        cli("probe", "--target-length", "0"),
        names=("--target-length",),
    ),
    Case(
        "probe config target_length",
        "numbers",
        lambda t: __import__("precision_plugin.probe", fromlist=["x"]).ProbeConfig(target_length=0),
        names=("target-length",),
    ),
    Case(
        "cli gguf-checkpoint missing source",
        "cli",
        cli("gguf-checkpoint", lambda t: str(t / "no.gguf"), lambda t: str(t / "out")),
        names=("does not exist",),
    ),
    Case(
        "cli gguf-checkpoint not a package",
        "cli",
        cli("gguf-checkpoint", "no-such-package-x", lambda t: str(t / "out")),
        names=("neither a .gguf file nor an installed package",),
    ),
    Case(
        "cli gguf-checkpoint out not empty",
        "cli",
        cli(
            "gguf-checkpoint",
            lambda t: str(write(t, "m.gguf", b"GGUF")),
            lambda t: str(write(t, "out/x", "x").parent),
        ),
        names=("not an empty folder",),
    ),
    Case("cli json folder", "cli", cli("probe", "--json", lambda t: str(t)), names=("folder",)),
    Case(
        "cli json no parent",
        "cli",
        cli("probe", "--json", lambda t: str(t / "no/x.json")),
        names=("does not exist",),
    ),
    Case(
        "cli json under a file",
        "cli",
        cli("probe", "--json", lambda t: str(write(t, "f", "x") / "x.json")),
        names=("is a file",),
    ),
    Case("cli device banana", "cli", cli("probe", "--device", "banana"), names=("device",)),
    Case(
        "cli device cuda",
        "cli",
        cli("probe", "--device", "cuda:0"),
        names=("device",),
        skip=no_cuda_only,
    ),
    Case("cli doctor int8", "cli", cli("doctor", "--dtype", "int8"), names=("int8",)),
    Case(
        "cli doctor env",
        "cli",
        cli("doctor"),
        env={"PRECISION_PLUGIN": "fp8"},
        names=("PRECISION_PLUGIN='fp8'",),
    ),
    Case(
        "cli plot txt",
        "cli",
        cli("probe", "--plot", lambda t: str(t / "fig.txt")),
        names=("--plot", "extension"),
    ),
    *NEW_SURFACES,
    *AUDIT_SURFACES,
    *MEANING_SURFACES,
    *FILE_SURFACES,
    *NUMBER_SURFACES,
    *PUBLIC_SURFACES,
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(
    case: Case,
    tmp_path: Path,
    tiny_checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _CHECKPOINT[:] = [tiny_checkpoint]
    if case.skip is not None and (why := case.skip()):
        pytest.skip(why)
    for module in case.needs:
        __import__(module)
    monkeypatch.delenv("PRECISION_PLUGIN", raising=False)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.WARNING, logger="precision_plugin")
    baseline = _snapshot()
    assert baseline["policy"] is None and baseline["patches"] == {}
    if case.enable is not None:
        pp.enable(**case.enable)
    before = _snapshot()
    try:
        if getattr(case.run, "is_cli", False):
            rc = case.run(tmp_path)
            # Progress lines (stderr is no terminal here) come before; the error is one line.
            err = "\n".join(
                line
                for line in capsys.readouterr().err.strip().splitlines()
                if not re.match(r"precision-plugin: \[\d+:\d\d:\d\d\] ", line)
            )
            assert rc == case.exit, err
            assert len(err.splitlines()) == 1, err  # one line, no traceback
            for word in case.names:
                assert word in err, err
        elif case.raises is None:
            result = case.run(tmp_path)
            assert case.check is not None
            case.check(result, caplog)
        else:
            with pytest.raises(case.raises) as info:
                case.run(tmp_path)
            message = str(info.value)
            assert "\n" not in message.strip(), message  # one message, not a dump
            for word in case.names:
                assert word in message, message
        _assert_unchanged(before, "the bad input changed something")
    finally:
        pp.disable()
    _assert_unchanged(baseline, "enable()/disable() around the bad input left something")


def test_the_catalogue_is_large_and_its_count_is_documented() -> None:
    assert len(CASES) >= 400
    text = (DOCS / "troubleshooting.md").read_text()
    assert f"{len(CASES)} bad inputs tried, each a clear error" in text
    for cls in sorted({c.cls for c in CASES}):
        assert f"`{cls}`" in text, f"docs/troubleshooting.md does not list the class {cls!r}"


def test_the_cases_hit_every_entry_point() -> None:
    assert {c.cls for c in CASES} >= {
        "numbers",
        "files",
        "kinds",
        "state",
        "cli",
        "messages",
        "device",
        "paths",
        "env",
        "enable",
        "conflict",
        "policy",
    }
    assert math.isinf(INF)
