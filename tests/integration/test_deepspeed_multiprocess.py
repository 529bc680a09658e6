"""Two DeepSpeed ranks on loopback (torchrun, gloo): an overflow on one rank skips the step on
both, the parameters stay identical across ranks, and the loss scale stays in step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from tests.integration import ds_cpu
from tests.integration.ds_two_rank_worker import POISONED_STEP, STEPS

ROOT = Path(__file__).resolve().parents[2]
STAGES = [0, 2, 3]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Run the worker once on two ranks for every stage; return {rank: {stage: result}}."""
    out = tmp_path_factory.mktemp("ds2")
    env = ds_cpu.launcher_env(ROOT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={ds_cpu.free_port()}",
        "--max-restarts=0",
        "-m",
        "tests.integration.ds_two_rank_worker",
        str(out),
        ",".join(str(s) for s in STAGES),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("stage", STAGES)
def test_overflow_on_one_rank_skips_on_both(two_ranks, stage):
    r0, r1 = two_ranks[0][str(stage)], two_ranks[1][str(stage)]
    for result in (r0, r1):
        assert result["fp16"] and not result["bf16"]  # the bf16 config ran fp16 on both ranks
    assert r0["records"] == r1["records"]  # applied/skipped, scale and counts in step
    applied = [rec["applied"] for rec in r0["records"]]
    assert applied == [step != POISONED_STEP for step in range(STEPS)]
    assert r0["records"][-1]["skipped"] == 1
    assert r0["records"][POISONED_STEP]["scale"] == r0["records"][0]["scale"] / 2
    assert r0["params"] == r1["params"]  # bit-identical across ranks
