"""Telemetry across processes (torchrun on loopback, gloo): two processes report the
token-weighted figures one process reports on the same batch, and both ranks log the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from precision_plugin.consequence import CONSEQUENCE_METRICS, compute_consequence
from precision_plugin.mismatch import compute_mismatch
from tests.integration import ds_cpu
from tests.integration.trl_two_rank_worker import fixed_batch

ROOT = Path(__file__).resolve().parents[2]


def _launch(tmp_path: Path, world: int) -> dict[int, dict]:
    out = tmp_path / f"world{world}"
    out.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={world}",
        "--master-addr=127.0.0.1",
        f"--master-port={ds_cpu.free_port()}",
        "--max-restarts=0",
        "-m",
        "tests.integration.trl_two_rank_worker",
        str(out),
    ]
    env = ds_cpu.launcher_env(ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(world)}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_equal_one_process(tmp_path):
    one = _launch(tmp_path, 1)[0]
    two = _launch(tmp_path, 2)
    whole = compute_mismatch(*fixed_batch()).to_dict() | compute_consequence(*fixed_batch()).to_dict()
    assert set(CONSEQUENCE_METRICS) <= set(one["fixed"])
    assert 0 < whole["seq_mask_fraction_verl"] < 1 and 0 < whole["ess"] < 1
    for name, value in one["fixed"].items():
        assert value == pytest.approx(whole[name], rel=1e-12), name
        for rank in (0, 1):  # the fixed batch split over two ranks: the same figures
            assert two[rank]["fixed"][name] == pytest.approx(value, rel=1e-12), (rank, name)
    # The real GRPO run on two ranks: gathered, so both ranks log the same token-weighted
    # figures, counting the tokens of the whole batch (4 completions per rank).
    assert two[0]["logs"] == two[1]["logs"]
    for entry in two[0]["logs"]:
        assert entry["precision/tokens"] == pytest.approx(entry["completions/mean_length"] * 8)
        assert 0 <= entry["precision/k3_kl"] < 1e-4
        assert 0 < entry["precision/ess"] <= 1 and entry["precision/seq_mask_fraction_verl"] >= 0
    for entry in one["logs"]:
        assert entry["precision/tokens"] == pytest.approx(entry["completions/mean_length"] * 4)
