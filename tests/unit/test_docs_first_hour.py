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
    # the hint that makes them faster comes before the first of them, not after (issue 54)
    assert section.index("OMP_NUM_THREADS=1") < quick


def _slug(heading: str) -> str:
    """The anchor MkDocs (python-markdown's toc) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)}


def broken_links(doc: Path) -> list[str]:
    """Relative links of ``doc`` whose file or ``#anchor`` does not exist."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto: ...
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (anchor and anchor not in _anchors(linked)):
            broken.append(target)
    return broken


def test_the_readme_and_quickstart_links_resolve(tmp_path):
    for doc in (ROOT / "README.md", ROOT / "docs" / "quickstart.md"):
        assert not broken_links(doc), (doc.name, broken_links(doc))
    planted = tmp_path / "README.md"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cli.md").write_text("# Command line\n\n### What the mismatch does\n")
    planted.write_text(
        "[a](docs/cli.md#what-the-mismatch-does) [b](docs/cli.md#gone) [c](docs/none.md) "
        "[d](https://example.org/x)"
    )
    assert broken_links(planted) == ["docs/cli.md#gone", "docs/none.md"]


def test_the_readme_shows_what_the_project_does_beyond_the_first_table():
    """Issue 54: the attribution, the rollout as configured, the canary (the one-line enable()
    form and the recipe flag) and the batch size are found from the README and the quickstart,
    each with the line of output to read."""
    readme = (ROOT / "README.md").read_text()
    section = _section(readme, "## Beyond the first table")
    for needed in (
        "probe --attribute",
        "probe --rollout ",
        'enable(metrics={"canary_every": ',
        "--canary-every ",
        "probe --batch-size ",
        "](docs/attribution.md)",
        "](docs/canary.md)",
    ):
        assert needed in section, needed
    assert section.count("The line to read is") == 3
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    for needed in ("--attribute", "--rollout", "--batch-size", "canary_every", "--canary-every"):
        assert needed in quickstart, needed
    assert "](attribution.md)" in quickstart and "](canary.md)" in quickstart
