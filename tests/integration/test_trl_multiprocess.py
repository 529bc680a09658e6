"""Telemetry across processes (torchrun on loopback, gloo): two processes report the
token-weighted figures one process reports on the same batch, both ranks log the same, and a
real two-rank GRPO run logs the figures recomputed from both ranks' tensors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from precision_plugin._core.metrics.consequence import CONSEQUENCE_METRICS, compute_consequence
from precision_plugin._core.metrics.mismatch import compute_mismatch
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


def _gathered(calls: list[dict]) -> dict[str, float]:
    """The token-weighted figures over every rank's slice of one step, from the tensors each
    rank's ``_compute_loss`` received (π: old_per_token_logps, else the loss's own log-probs)."""
    d, gaps = [], []
    for call in calls:
        pi = torch.tensor(call.get("old_per_token_logps", call.get("pi")), dtype=torch.float64)
        mu = torch.tensor(call["sampling_per_token_logps"], dtype=torch.float64)
        mask = torch.tensor(call["completion_mask"]).bool()
        if "tool_mask" in call:
            mask &= torch.tensor(call["tool_mask"]).bool()
        d.append((pi - mu)[mask])  # log π − log μ over the counted tokens
        gaps.append((pi.exp() - mu.exp())[mask].abs())
    r, gap = torch.cat(d), torch.cat(gaps)
    assert r.numel() and not r.isnan().any()
    return {
        "tokens": float(r.numel()),
        "k1_kl": float(-r.mean()),
        "k3_kl": float((torch.expm1(r) - r).mean()),
        "prob_diff_mean": float(gap.mean()),
        "prob_diff_max": float(gap.max()),
        "logp_abs_diff_mean": float(r.abs().mean()),
        "drift_per_1k": 1000 * float(r.mean()),
    }


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_equal_one_process(tmp_path):
    one = _launch(tmp_path, 1)[0]
    two = _launch(tmp_path, 2)
    whole = (
        compute_mismatch(*fixed_batch()).to_dict() | compute_consequence(*fixed_batch()).to_dict()
    )
    # Bit-equal share (issue 35): the fixed batch's sides differ by 0.4·randn on every token,
    # so none is equal, over every masked token (the NaN one counts in the total, not as equal).
    train, rollout, mask = fixed_batch()
    same = (train.float().view(torch.int32) == rollout.float().view(torch.int32)) & mask
    whole["bitwise_equal_frac"] = float(same.sum()) / float(mask.sum())
    assert whole["bitwise_equal_frac"] == 0.0
    assert set(CONSEQUENCE_METRICS) <= set(one["fixed"])
    assert 0 < whole["seq_mask_fraction_verl"] < 1 and 0 < whole["ess"] < 1
    for name, value in one["fixed"].items():
        assert value == pytest.approx(whole[name], rel=1e-12), name
        for rank in (0, 1):  # the fixed batch split over two ranks: the same figures
            assert two[rank]["fixed"][name] == pytest.approx(value, rel=1e-12), (rank, name)
    # The real GRPO run on two ranks: gathered, so both ranks log the same token-weighted
    # figures, counting the tokens of the whole batch (4 completions per rank).
    assert two[0]["logs"] == two[1]["logs"]
    for step, entry in enumerate(two[0]["logs"]):
        assert entry["precision/tokens"] == pytest.approx(entry["completions/mean_length"] * 8)
        expected = _gathered([two[r]["calls"][step] for r in (0, 1)])
        for name, value in expected.items():
            assert entry[f"precision/{name}"] == pytest.approx(value, rel=1e-9, abs=1e-15), name
        assert 0 < entry["precision/ess"] <= 1 and entry["precision/seq_mask_fraction_verl"] >= 0
    for entry in one["logs"]:
        assert entry["precision/tokens"] == pytest.approx(entry["completions/mean_length"] * 4)
