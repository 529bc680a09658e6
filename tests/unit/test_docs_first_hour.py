"""What a new user reads first: the README opens with the probe's figure and a results table
that reads as plain text; installs name a path or a wheel (the package is on no index) and never
the PyTorch download site; the quickstart has a GPU and a CPU/offline path; the real model's
quick look comes before its long run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS += sorted((ROOT / "integrations").glob("*/README.md"))


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^#{1,3} ", text[start + len(heading) :], re.M)
    return text[start : start + len(heading) + (following.start() if following else len(text))]


def test_readme_opens_with_the_probe_figure_and_a_plain_text_table():
    text = (ROOT / "README.md").read_text()
    first_screen = text[: text.index("\n## ")]
    assert "](docs/assets/probe.png)" in first_screen
    assert (ROOT / "docs" / "assets" / "probe.png").is_file()
    block = re.search(
        r"<!-- results: probe-embedded readme-summary -->\n(.*?)\n<!-- /results -->",
        first_screen,
        re.S,
    )
    assert block, "the short results table is rendered from the results files"
    lines = block.group(1).splitlines()
    assert len(lines) >= 3 and len({len(line) for line in lines}) == 1  # columns line up raw
    assert "<!--" not in block.group(1)  # no markers inside the table
    assert "Figures vary by CPU" in first_screen
    # Each kept share names the batch it is for (issue 32): a batch of N from the results file's
    # consequence.batch_size, the infinite-batch limit only labelled as such.
    import json

    for line, name in zip(lines[2:], ("probe-embedded", "smollm2-1024"), strict=True):
        run = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())
        batch = run["consequence"].get("batch_size")
        assert (f"(N={batch:,})" if batch else "(infinite batch)") in line, line


def test_no_install_names_a_package_index_the_project_is_not_on():
    for doc in DOCS:
        text = doc.read_text()
        assert "pip install precision_plugin" not in text, doc
        assert not re.search(r"not `-e`|non-editable", text), doc


def test_quickstart_has_a_gpu_and_a_cpu_offline_path():
    text = (ROOT / "docs" / "quickstart.md").read_text()
    gpu = _section(text, "### On a GPU machine")
    cpu = _section(text, "### On a CPU machine, or offline")
    assert 'pip install ".[trl]"' in gpu and "download.pytorch.org" not in text
    commands = re.findall(
        r"^(\S.*?)(?:\s+#.*)?$", "\n".join(re.findall(r"```bash\n(.*?)```", cpu, re.S)), re.M
    )
    assert commands[0].startswith("bash scripts/dev.sh")
    by_hand = [c for c in commands if "pip install" in c]
    assert by_hand and all("-c constraints.txt" in c for c in by_hand)


def test_the_real_model_quick_look_comes_before_the_long_run():
    text = (ROOT / "docs" / "cli.md").read_text()
    section = _section(text, "### A real model: SmolLM2-135M-Instruct")
    quick = section.index("--max-new-tokens 256 --min-new-tokens 256 --num-prompts 8")
    long = section.index("--max-new-tokens 1024 --min-new-tokens 1024")
    assert quick < long
