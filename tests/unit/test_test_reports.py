"""The closing table of ``scripts/dev.sh test`` (scripts/test_summary.py), the CPU kernels in
results files' provenance, and the room of the kernel-sensitive thresholds (tests/kernels.py)
in the measured margins (docs/results/kernel-margins.json)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from precision_plugin._base.provenance import cpu_kernels, provenance
from tests.kernels import FIRST_ORDER, SECOND_ORDER, SETTINGS, THRESHOLDS

ROOT = Path(__file__).resolve().parents[2]


def _summary():
    spec = importlib.util.spec_from_file_location("test_summary", ROOT / "scripts/test_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.unit.test_a" name="test_two" time="12.0"><failure message="x"/></testcase>
<testcase classname="tests.integration.test_b" name="test_three" time="0.2"><skipped message="no"/></testcase>
<testcase classname="tests.integration.test_ds" name="test_fp16" time="3.0"><properties>
<property name="deepspeed_fp16" value="forced"/></properties></testcase>
<testcase classname="tests.integration.test_ds" name="test_refused" time="2.0"><properties>
<property name="deepspeed_fp16_refused" value="native"/></properties></testcase>
</testsuite></testsuites>"""


def test_the_table_counts_every_suite_and_fails_if_one_failed(tmp_path, capsys):
    (tmp_path / "suites").write_text("ruff\nmain\nmkdocs\n")
    (tmp_path / "ruff.status").write_text("0 6\n")
    (tmp_path / "main.status").write_text("1 780\n")
    (tmp_path / "main.xml").write_text(JUNIT)
    (tmp_path / "mkdocs.status").write_text("0 30\n")
    assert _summary().main([str(tmp_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:6] == [
        "| suite | passed | failed | skipped | minutes | slowest tests |",
        "|---|---:|---:|---:|---:|---|",
        "| ruff | ok |  |  | 0.1 |  |",
        "| main | 3 | 1 | 1 | 13.0 | test_a::test_two 12s; test_ds::test_fp16 3s; "
        "test_ds::test_refused 2s |",
        "| mkdocs | ok |  |  | 0.5 |  |",
        "| sum of suites | | | | 13.6 | |",
    ]
    assert "DeepSpeed fp16 branch (the engine runs fp16): 1 tests in main, forced" in lines
    assert lines[-1] == "failed suites: main"


def test_all_green_exits_0_and_a_failed_collection_shows(tmp_path, capsys):
    (tmp_path / "suites").write_text("main\n")
    (tmp_path / "main.status").write_text("0 60\n")
    (tmp_path / "main.xml").write_text(JUNIT.replace('<failure message="x"/>', ""))
    assert _summary().main([str(tmp_path)]) == 0
    (tmp_path / "suites").write_text("main\nkernels-floor\n")
    (tmp_path / "kernels-floor.status").write_text("5 3\n")  # pytest: no test collected
    (tmp_path / "kernels-floor.xml").write_text("<testsuites><testsuite/></testsuites>")
    assert _summary().main([str(tmp_path)]) == 1
    assert "| kernels-floor | 0 | exit 5 | 0 | 0.1 |  |" in capsys.readouterr().out


def test_the_wall_time_counts_from_the_start_of_the_run(tmp_path, capsys, monkeypatch):
    import time

    (tmp_path / "suites").write_text("setup-engine\n")
    (tmp_path / "setup-engine.status").write_text("0 300\n")
    (tmp_path / "started").write_text("1000\n")
    monkeypatch.setattr(time, "time", lambda: 1000 + 3300)
    assert _summary().main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| setup-engine | ok |  |  | 5.0 |  |" in out
    assert "wall time, set-up included: 55.0 min" in out


def test_provenance_says_which_kernels_ran(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    kernels = provenance(["x"])["machine"]["kernels"]
    assert kernels == cpu_kernels()
    assert kernels["capability"] == torch.backends.cpu.get_cpu_capability()
    assert kernels["onednn_fp16"] == torch.ops.mkldnn._is_mkldnn_fp16_supported()
    assert kernels["caps"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "ONEDNN_MAX_CPU_ISA" not in kernels["caps"]


def test_thresholds_follow_the_rounding_theory():
    assert (FIRST_ORDER, SECOND_ORDER) == (8.0, 64.0)  # 2^-8 / 2^-11, and its square
    assert THRESHOLDS == {"k3": 8.0, "logp_abs_diff": 2.0, "variance": 2.0}


def test_every_threshold_has_three_times_room_on_every_setting():
    """The measured ratios (5 seeds x 3 kernel settings) over each test's threshold."""
    data = json.loads((ROOT / "docs/results/kernel-margins.json").read_text())
    assert set(data["settings"]) == set(SETTINGS)
    assert {r["setting"] for r in data["runs"]} == set(SETTINGS)
    for run in data["runs"]:
        for stat, threshold in THRESHOLDS.items():
            assert run["ratios"][stat] >= 3 * threshold, (run["config"], run["seed"], stat)
        caps = run["kernels"]["caps"]
        assert caps == SETTINGS[run["setting"]], run


def test_the_kernel_sensitive_runs_in_dev_sh_use_the_settings():
    text = (ROOT / "scripts/dev.sh").read_text()
    for name in ("avx2", "floor"):
        env = " ".join(f"{k}={v}" for k, v in SETTINGS[name].items())
        assert re.search(rf"run_pytest kernels-{name} .*-m kernel_sensitive.*\n.*-- {env}", text)
    assert (ROOT / ".ci/run").read_text().strip().endswith("bash scripts/dev.sh test")


@pytest.mark.parametrize("setting", ["avx2", "floor"])
def test_the_caps_are_what_the_docs_say(setting):
    env = " ".join(f"{k}={v}" for k, v in SETTINGS[setting].items())
    assert env in (ROOT / "docs/testing.md").read_text()


def _margins():
    spec = importlib.util.spec_from_file_location(
        "kernel_margins", ROOT / "scripts/kernel_margins.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_merge_keeps_the_other_cells_and_each_run_says_who_measured_it():
    """``kernel_margins.py --merge``: the earlier file's runs stay (with that file's provenance
    when they carry none), a cell run again is replaced, and the grid keeps its plan."""
    margins = _margins()
    earlier = {"command": "python scripts/kernel_margins.py --jobs 2", "date": "d0"}
    old = {
        "planned": 30,
        "runs": [
            {"config": "embedded", "setting": "floor", "seed": 1, "ratios": {"k3": 1.0}},
            {"config": "smollm2", "setting": "native", "seed": 0, "ratios": {"k3": 2.0}},
            {"config": "embedded", "setting": "native", "seed": 2, "ratios": {"k3": 3.0}},
        ],
        "provenance": earlier,
    }
    kept = margins.kept_runs(old, {("embedded", "native", 2), ("embedded", "avx2", 2)})
    assert [margins.cell(r) for r in kept] == [("embedded", "floor", 1), ("smollm2", "native", 0)]
    assert all(r["provenance"] == earlier for r in kept)
    assert "provenance" not in old["runs"][0]  # the earlier file's data is not changed
    mine = {"command": "python scripts/kernel_margins.py --merge", "date": "d1"}
    new = [
        {"config": "embedded", "setting": s, "seed": 2, "ratios": {"k3": 4.0}, "provenance": mine}
        for s in ("avx2", "native")
    ]
    data = margins.merged(kept, new, old["planned"], len(kept) + 2)
    assert data["planned"] == 30 and data["settings"] == SETTINGS
    assert [margins.cell(r) for r in data["runs"]] == [
        ("smollm2", "native", 0),
        ("embedded", "floor", 1),
        ("embedded", "native", 2),
        ("embedded", "avx2", 2),
    ]
    assert [r["provenance"]["date"] for r in data["runs"]] == ["d0", "d0", "d1", "d1"]
    assert margins.merged([], new, 0, 2)["planned"] == 2
    assert margins.kept_runs(None, set()) == []
