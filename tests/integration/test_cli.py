"""``precision-plugin probe`` through the command line: outputs, exit codes, one-line errors."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from precision_plugin._core.manager import get_plugin_manager
from precision_plugin.cli import main
from precision_plugin.probe.tiny_model import build_tokenizer
from tests.kernels import THRESHOLDS

from .test_probe import _pad_masking_factory

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def qwen_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly saved small Qwen2 (not the default's architecture or size), pad id = EOS id."""
    tokenizer = build_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.05,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(11)
    model = Qwen2ForCausalLM(config)
    folder = tmp_path_factory.mktemp("cli") / "qwen2-tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.kernel_sensitive
def test_probe_on_a_saved_model_writes_json_and_png(
    qwen_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_png = tmp_path / "probe.json", tmp_path / "probe.png"
    args = ["probe", "--model", str(qwen_checkpoint), "--num-prompts", "8"]
    args += ["--max-new-tokens", "64", "--device", "cpu", "--seed", "1", "--target-length", "2048"]
    args += ["--batch-size", "64"]
    rc = main([*args, "--json", str(out_json), "--plot", str(out_png)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = " ".join(captured.out.split())
    assert (
        "float32 (the self-check)" in out and "bfloat16 at 2,048 tokens: a batch of 64 keeps" in out
    )
    assert "do: " in out and "layerwise" not in out  # the table and its lines
    data = json.loads(out_json.read_text())
    assert data["model"] == str(qwen_checkpoint) and data["engine"] == "hf"
    provenance = data["provenance"]  # what produced the file, for published figures
    assert provenance["command"] == shlex.join(
        ["precision-plugin", *args, "--json", str(out_json), "--plot", str(out_png)]
    )
    assert provenance["versions"]["torch"] == torch.__version__
    k3 = {name: r["k3_kl"] for name, r in data["results"].items()}
    assert k3["float32"] < 1e-9
    # 8 sequences up to 64 tokens: the k3 ratio (theory ~64) above THRESHOLDS["k3"].
    assert k3["bfloat16"] > THRESHOLDS["k3"] * k3["float16"]
    assert data["bf16_over_fp16_k3"] == pytest.approx(k3["bfloat16"] / k3["float16"])
    assert data["consequence"]["target_length"] == 2048
    assert data["consequence"]["batch_size"] == data["settings"]["batch_size"] == 64
    ess = data["consequence"]["dtypes"]["bfloat16"]["at_target"]["ess_batch"]
    assert sorted(ess, key=int) == ["64", "256", "1024"]  # --batch-size 64 and the reported ones
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    assert out_png.stat().st_size > 20_000


@pytest.mark.slow
def test_failed_self_check_exits_1_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """An engine from a plugin (the ``precision_probe_engines`` hook) that breaks alignment."""
    from precision_plugin.hookspecs import hookimpl

    class BrokenEnginePlugin:
        @hookimpl
        def precision_probe_engines(self) -> dict:
            return {"pad-masking": _pad_masking_factory}

    pm = get_plugin_manager()
    plugin = BrokenEnginePlugin()
    pm.register(plugin, name="test-broken-engine")
    try:
        args = ["probe", "--engine", "pad-masking", "--dtypes", "fp16", "--num-prompts", "3"]
        rc = main([*args, "--max-new-tokens", "16", "--json", "-"])
    finally:
        pm.unregister(plugin)
    captured = capsys.readouterr()
    assert rc == 1
    assert "INVALID MEASUREMENT" in captured.err
    data = json.loads(captured.out)  # --json - keeps stdout pure JSON
    assert data["self_check"]["passed"] is False
    assert data["results"]["float16"]["verdict"] == "invalid"


@pytest.mark.slow
def test_probe_with_a_prompts_file_of_mixed_lengths(
    qwen_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "Hi"},
        {"prompt": "A considerably longer prompt, to be batched with the short ones"},
        {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    out_json = tmp_path / "probe.json"
    args = ["probe", "--model", str(qwen_checkpoint), "--prompts", str(prompts)]
    args += ["--max-new-tokens", "24", "--device", "cpu", "--json", str(out_json)]
    rc = main(args)
    assert rc == 0, capsys.readouterr().err
    data = json.loads(out_json.read_text())
    assert data["self_check"]["passed"] is True
    assert data["settings"]["prompts"] == "user"
    assert data["settings"]["num_prompts"] == 3  # one completion per prompt of the file
    assert data["results"]["bfloat16"]["sequences"] == 3


def _no_config_dir(tmp_path: Path) -> str:
    folder = tmp_path / "empty"
    folder.mkdir()
    return str(folder)


BAD_ARGS = {
    "missing model": (lambda tmp: ["probe", "--model", str(tmp / "nope")], "does not exist"),
    "no config.json": (lambda tmp: ["probe", "--model", _no_config_dir(tmp)], "config.json"),
    "hub id": (
        lambda tmp: ["probe", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"],
        "looks like a Hugging Face Hub id, and the probe downloads nothing",
    ),
    "unknown dtype": (lambda tmp: ["probe", "--dtypes", "fp16,fp8"], "'fp8'"),
    "empty dtypes": (lambda tmp: ["probe", "--dtypes", ","], "names no dtype"),
    "zero prompts": (lambda tmp: ["probe", "--num-prompts", "0"], "positive integer"),
    "negative tokens": (lambda tmp: ["probe", "--max-new-tokens=-5"], "positive integer"),
    "text tokens": (lambda tmp: ["probe", "--max-new-tokens", "many"], "positive integer"),
    "negative seed": (lambda tmp: ["probe", "--seed=-1"], ">= 0"),
    "unknown engine": (lambda tmp: ["probe", "--engine", "sglang"], "invalid choice"),
    "json dir missing": (
        lambda tmp: ["probe", "--json", str(tmp / "no" / "x.json")],
        "does not exist",
    ),
    "json is a folder": (lambda tmp: ["probe", "--json", str(tmp)], "is a folder"),
    "json replaces the model's config": (
        lambda tmp: [
            "probe",
            "--model",
            str(_checkpoint(tmp)),
            "--json",
            str(tmp / "ckpt" / "config.json"),
        ],
        "is a file of the --model folder",
    ),
    "json where no file can be made": (
        lambda tmp: ["probe", "--json", "/proc/results.json"],
        "no file can be created in folder '/proc'",
    ),
    "plot not an image": (
        lambda tmp: ["probe", "--plot", str(tmp / "fig.txt")],
        "txt extension is not an image format",
    ),
    "attribution plot not an image": (
        lambda tmp: ["probe", "--attribute", "--attribution-plot", str(tmp / "why.txt")],
        "--attribution-plot: cannot write",
    ),
    "attribution plot dir missing": (
        lambda tmp: ["probe", "--attribute", "--attribution-plot", str(tmp / "no" / "why.png")],
        "does not exist",
    ),
    "attribution plot is the plot": (
        lambda tmp: [
            "probe",
            "--attribute",
            "--plot",
            str(tmp / "fig.png"),
            "--attribution-plot",
            str(tmp / "fig.png"),
        ],
        "is the same file as the output --plot",
    ),
    "bad device": (lambda tmp: ["probe", "--device", "tpu9"], "device"),
    "meta device": (lambda tmp: ["probe", "--device", "meta"], "not a device the plugin runs on"),
    "absent gpu index": (lambda tmp: ["probe", "--device", "cuda:99"], "device: 'cuda:99'"),
    "too many tokens": (lambda tmp: ["probe", "--max-new-tokens", "5000"], "max_position"),
    "missing prompts file": (
        lambda tmp: ["probe", "--prompts", str(tmp / "none.txt")],
        "none.txt' does not exist",
    ),
    "min above max": (
        lambda tmp: ["probe", "--max-new-tokens", "8", "--min-new-tokens", "9"],
        "min-new-tokens: 9",
    ),
    "learning rate past float": (
        lambda tmp: ["probe", "--attribute", "--learning-rate", "1e400"],
        "--learning-rate: '1e400' is not a number in (0, 1]",
    ),
    "learning rate zero": (
        lambda tmp: ["probe", "--attribute", "--learning-rate", "0"],
        "--learning-rate: '0' is not a number in (0, 1]",
    ),
    "unknown command": (lambda tmp: ["train"], "invalid choice"),
    "doctor dtype": (lambda tmp: ["doctor", "--dtype", "int8"], "'int8'"),
    # gguf-checkpoint: the source and the folder are checked before the minutes of conversion
    # (a text file named .gguf was a transformers ValueError traceback; a folder that cannot be
    # made, an OSError traceback after the conversion)
    "gguf source not gguf": (
        lambda tmp: ["gguf-checkpoint", _file(tmp, "m.gguf", b"not gguf"), str(tmp / "out")],
        "is not a GGUF file (it does not start with the bytes 'GGUF'",
    ),
    "gguf source a folder": (
        lambda tmp: ["gguf-checkpoint", str(_folder(tmp, "m.gguf")), str(tmp / "out")],
        "m.gguf' is a folder; pass a .gguf file",
    ),
    "gguf out under a file": (
        lambda tmp: ["gguf-checkpoint", _gguf(tmp), str(tmp / "m.gguf" / "out")],
        "m.gguf' is a file, not a folder",
    ),
    "gguf out where no folder can be made": (
        lambda tmp: ["gguf-checkpoint", _gguf(tmp), "/proc/precision-plugin-out"],
        "no folder can be created in '/proc'",
    ),
    "gguf out empty": (
        lambda tmp: ["gguf-checkpoint", _gguf(tmp), ""],
        "out: the path is empty",
    ),
    # probe: a batch of 10**26 sequences ran the whole probe, then ended in an OverflowError
    # traceback from the ESS; a target length of 10**24 tokens was projected to without a word
    "probe batch size past any batch": (
        lambda tmp: ["probe", "--batch-size", str(10**26)],
        f"batch-size: {10**26} is out of range; pass 1 .. 1000000, the sequences per batch you "
        f"train with (default 256).",
    ),
    "probe target length past any context": (
        lambda tmp: ["probe", "--target-length", "10000001"],
        "target-length: 10000001 is out of range; pass 1 .. 10000000, the completion length you "
        "train at (default 4096).",
    ),
    # sanity: a seed numpy cannot take was a ValueError traceback from the trainer's set_seed;
    # 1e400 parsed as inf and was refused as SanityConfig's argument, not the option
    "sanity seed past 32 bits": (
        lambda tmp: ["sanity", "--seed", str(2**32)],
        "seeds: 4294967296 is out of range",
    ),
    # 10**23 steps were accepted and the run went on until stopped
    "sanity steps past a million": (
        lambda tmp: ["sanity", "--steps", str(10**23)],
        f"steps: {10**23} is out of range; pass 1 .. 1000000 (default 60).",
    ),
    "sanity seeds past 32 bits": (
        lambda tmp: ["sanity", "--seeds", f"0,{2**70}"],
        f"seeds: {2**70} is out of range",
    ),
    "sanity learning rate past float": (
        lambda tmp: ["sanity", "--learning-rate", "1e400"],
        "argument --learning-rate: '1e400' is not a finite number > 0",
    ),
    "sanity learning rate inf": (
        lambda tmp: ["sanity", "--learning-rate", "inf"],
        "argument --learning-rate: 'inf' is not a finite number > 0",
    ),
    # openrlhf-args --runtime-env: a float32 policy (which OpenRLHF's learner cannot run) and a
    # version it never reads were printed with exit 0
    "openrlhf runtime env float32": (
        lambda tmp: ["openrlhf-args", "--runtime-env", "--dtype", "float32"],
        "--runtime-env for a float32 policy: OpenRLHF's learner runs bf16 or fp16 only",
    ),
    "openrlhf runtime env version": (
        lambda tmp: ["openrlhf-args", "--runtime-env", "--openrlhf-version", "banana"],
        "--openrlhf-version 'banana': the Ray runtime env is the same for every OpenRLHF",
    ),
}


def _file(tmp: Path, name: str, data: bytes) -> str:
    (tmp / name).write_bytes(data)
    return str(tmp / name)


def _folder(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir()
    return tmp / name


def _gguf(tmp: Path) -> str:
    """A file that starts like a GGUF file (the checks of the output folder come before any
    read past the magic bytes)."""
    return _file(tmp, "m.gguf", b"GGUF" + bytes(16))


def _checkpoint(tmp: Path) -> Path:
    """A folder that looks like a checkpoint (the output check runs before any load)."""
    folder = tmp / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return folder


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_input_is_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, expected = BAD_ARGS[case]
    rc = main(build(tmp_path))
    err = capsys.readouterr().err
    # Progress lines (stderr is no terminal here) may come first; the error is one line.
    lines = [
        line
        for line in err.splitlines()
        if line.strip() and not re.match(r"precision-plugin: \[\d+:\d\d:\d\d\] ", line)
    ]
    assert rc == 2
    assert len(lines) == 1, err
    assert lines[0].startswith("precision-plugin: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err


def test_deepspeed_cpu_guess_is_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    # Importing DeepSpeed (transformers does, in the probe) warns that it falls back to the CPU;
    # in a fresh process that was a second line before every probe's output and error. The
    # command line drops that one record of DeepSpeed's logger and keeps the others.
    import logging

    main(["probe", "--max-new-tokens", "5000"])  # any model-loading command installs the filter
    capsys.readouterr()
    deepspeed_log = logging.getLogger("DeepSpeed")
    seen: list[str] = []
    catcher = logging.Handler()
    catcher.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    deepspeed_log.addHandler(catcher)
    try:
        deepspeed_log.warning("Setting accelerator to CPU. If you have GPU or other ...")
        deepspeed_log.warning("another DeepSpeed warning")
    finally:
        deepspeed_log.removeHandler(catcher)
    assert seen == ["another DeepSpeed warning"]


def test_cuda_without_a_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    rc = main(["probe", "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("precision-plugin: error: device: 'cuda'")
    assert "--device cpu" in err


def test_absent_mps_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.backends.mps.is_available():
        pytest.skip("MPS is present")
    rc = main(["probe", "--device", "mps"])  # was a RuntimeError traceback from .to("mps")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("precision-plugin: error: device: 'mps'")
    assert "Traceback" not in err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--model", "--engine", "--dtypes", "--num-prompts", "--max-new-tokens"):
        assert option in out
    for option in ("--seed", "--json", "--plot", "--device"):
        assert option in out
    assert main(["--version"]) == 0
    assert "precision-plugin 0." in capsys.readouterr().out


def test_python_dash_m_runs_the_same_cli(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "precision_plugin", "probe", "--model", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("precision-plugin: error: model: ")
    assert "Traceback" not in proc.stderr


def test_docs_cli_page_lists_every_option() -> None:
    import argparse

    from precision_plugin.cli import build_parser

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, subparser in sub.choices.items():
        assert f"precision-plugin {command}" in text
        for action in subparser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert f"`{option}" in text, f"docs/cli.md misses {command} {option}"


def test_a_failed_write_is_one_clear_error() -> None:
    from precision_plugin.cli.output import write
    from precision_plugin.errors import PrecisionPluginError

    def full_disk(path: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(PrecisionPluginError, match=r"--json: cannot write 'x.json': No space left"):
        write("x.json", "--json", full_disk)


def _cli(*args: str, shell_tail: str = "", env: dict[str, str] | None = None, **kw):
    """``python -m precision_plugin ARGS`` in a shell, so ``> /dev/full`` and ``>&-`` apply."""
    import os

    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "precision_plugin", *args))
    return subprocess.run(
        ["sh", "-c", f"exec {command} {shell_tail}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        **kw,
    )


@pytest.mark.parametrize("redirect", ["> /dev/full", ">&-"])
@pytest.mark.parametrize("command", [("verl-overrides",), ("doctor", "--json"), ("doctor",)])
def test_stdout_closed_or_full_is_one_line_and_exit_74(command, redirect) -> None:
    proc = _cli(*command, shell_tail=redirect)
    assert proc.returncode == 74, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("precision-plugin")]
    assert lines == [lines[-1]] and "cannot write the output" in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


@pytest.mark.slow
def test_the_probe_writes_its_results_before_failing_on_stdout(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = ("probe", "--num-prompts", "2", "--max-new-tokens", "4", "--dtypes", "float16")
    proc = _cli(*args, "--json", str(out), shell_tail="> /dev/full")
    assert proc.returncode == 74, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.rstrip().endswith(
        "precision-plugin: error: cannot write the output: No space left on device."
    )
    assert set(json.loads(out.read_text())["results"]) == {"float32", "float16"}
    closed = _cli(*args, shell_tail=">&-")  # no --json FILE: refused before the run
    assert closed.returncode == 74 and "no --json FILE" in closed.stderr
    assert "float32: rollout" not in closed.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "said"), [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")]
)
def test_a_stopped_probe_removes_its_temporary_model(tmp_path: Path, sig, code, said) -> None:
    import os
    import signal
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "precision_plugin", "probe", "--max-new-tokens", "256"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A test run started in the background inherits SIGINT ignored, and Python then installs
        # no KeyboardInterrupt handler: give the probe the default, as a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not any(tmp_path.glob("precision-probe-*/config.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the probe never saved its model"
            time.sleep(0.2)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert err.rstrip().endswith(f"precision-plugin: {said}") and "Traceback" not in err
    assert list(tmp_path.glob("precision-probe-*")) == []


@pytest.mark.parametrize("case", sorted(c for c in BAD_ARGS if c.startswith("attribution plot")))
def test_an_attribution_plot_path_is_refused_before_the_run(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figure is written after minutes of attribution: its path is checked first, as
    --plot's and --json's are (a missing folder was an error after the run, a .txt a
    matplotlib traceback)."""
    build, _ = BAD_ARGS[case]
    assert main(build(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "loading the trainer model" not in err and "rollout" not in err, err
