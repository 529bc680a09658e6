"""Every figure README.md, docs/ and integrations/*/README.md publish comes from a results file.

The figures live in results blocks (``<!-- results: NAME VIEW -->...<!-- /results -->``) that
``scripts/render_docs.py`` renders from ``docs/results/NAME.json``; each results file carries
the provenance its command wrote (``precision_plugin.provenance``).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _renderer():
    spec = importlib.util.spec_from_file_location(
        "render_docs", ROOT / "scripts" / "render_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_docs = _renderer()


@pytest.mark.parametrize(
    "path", render_docs.published_files(), ids=lambda p: str(p.relative_to(ROOT))
)
def test_published_blocks_equal_their_results_files(path):
    text = path.read_text(encoding="utf-8")
    assert render_docs.rendered(text) == text, (
        f"{path.relative_to(ROOT)}: a results block differs from its results file; run "
        f"`.venv/bin/python scripts/render_docs.py` (and rerun the command that wrote the file "
        f"if the figures are stale)"
    )


def _results_files():
    return sorted((ROOT / "docs" / "results").glob("*.json"))


@pytest.mark.parametrize("path", _results_files(), ids=lambda p: p.name)
def test_results_files_say_what_produced_them(path):
    provenance = json.loads(path.read_text(encoding="utf-8"))["provenance"]
    assert set(provenance) >= {"command", "date", "versions", "machine"}
    assert shlex.split(provenance["command"]) and provenance["versions"]["torch"]


def test_every_results_file_is_published_somewhere():
    names = {
        m["name"]
        for path in render_docs.published_files()
        for m in render_docs.blocks(path.read_text(encoding="utf-8"))
    }
    unpublished = {p.stem for p in _results_files()} - names
    assert not unpublished, f"results files no page shows: {sorted(unpublished)}"


# -- the renderer itself -------------------------------------------------------------------------
@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    from precision_plugin.provenance import write_results

    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    write_results(
        tmp_path / "demo.json",
        {"k3": {"float16": 2.875e-5}, "ratio": 47.25, "rows": [{"n": 1024}]},
        ["precision-plugin", "probe", "--json", "docs/results/demo.json"],
    )
    return tmp_path


def test_value_views_render_numbers_with_their_format(results_dir):
    text = (
        "k3 <!-- results: demo value:k3.float16:.2e -->old<!-- /results -->, "
        "<!-- results: demo value:ratio:.0f -->9<!-- /results -->x at "
        "<!-- results: demo value:rows.0.n:, --><!-- /results --> tokens"
    )
    assert render_docs.rendered(text) == (
        "k3 <!-- results: demo value:k3.float16:.2e -->2.88e-05<!-- /results -->, "
        "<!-- results: demo value:ratio:.0f -->47<!-- /results -->x at "
        "<!-- results: demo value:rows.0.n:, -->1,024<!-- /results --> tokens"
    )


def test_block_views_keep_their_own_lines(results_dir):
    text = "before\n<!-- results: demo command -->\nstale\n<!-- /results -->\nafter\n"
    assert render_docs.rendered(text) == (
        "before\n<!-- results: demo command -->\n`precision-plugin probe --json "
        "docs/results/demo.json`\n<!-- /results -->\nafter\n"
    )
    provenance = json.loads((results_dir / "demo.json").read_text())["provenance"]
    versions = ", ".join(f"{k} {v}" for k, v in provenance["versions"].items())
    machine = provenance["machine"]
    assert versions.startswith("precision_plugin 0.1.0, torch ")
    assert render_docs.rendered("<!-- results: demo provenance -->x<!-- /results -->") == (
        "<!-- results: demo provenance -->Produced by `precision-plugin probe --json "
        f"docs/results/demo.json` on {provenance['date'][:10]} ({versions}; {machine['cpus']} "
        f"CPUs, load average {machine['load_average'][0]:g}).<!-- /results -->"
    )


def test_an_unknown_view_names_the_known_ones(results_dir):
    with pytest.raises(KeyError, match="value:PATH"):
        render_docs.rendered("<!-- results: demo nosuchview -->x<!-- /results -->")


def test_a_marker_quoted_in_prose_does_not_swallow_the_next_block(results_dir):
    text = (
        "blocks sit between `<!-- results: NAME VIEW -->` markers.\n\n"
        "ratio <!-- results: demo value:ratio:.0f -->9<!-- /results -->x\n"
    )
    assert render_docs.rendered(text) == text.replace("-->9<", "-->47<")
