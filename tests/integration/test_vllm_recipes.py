"""integrations/vllm: the files exist, reference only what exists, and ``trl vllm-serve``'s own
parser reads the TRL recipe (vLLM's parser reads the plain recipe in tests/contract/)."""

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


def test_trl_vllm_serve_parses_the_recipe(tmp_path):
    pytest.importorskip("trl")
    from trl.scripts.vllm_serve import build_command, make_parser

    argv = exec_line(RECIPES / "serve_trl.sh", "trl", {"MODEL": str(tmp_path), "PORT": "8123"})
    assert argv[:2] == ["trl", "vllm-serve"]
    script_args, extra = make_parser().parse_args_and_config(
        args=argv[2:], return_remaining_strings=True
    )
    command = build_command(script_args, extra)
    serve = command[command.index("serve") :]
    assert serve[1] == str(tmp_path) and "8123" in serve
    # TRL passes --dtype auto, which the plugin's general plugin turns into the policy dtype.
    assert serve[serve.index("--dtype") + 1] == "auto"
