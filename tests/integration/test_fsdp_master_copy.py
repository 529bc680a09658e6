"""FSDP mixed precision keeps float32 master weights (its sharded parameters, which the optimizer
steps) and computes in the policy dtype: the audit names that copy, and finds none for a model
loaded in float16 (real FSDP2 ``fully_shard`` on a one-process gloo CPU world, in a subprocess so
its process group stays there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from precision_plugin.audit import contradictions
from precision_plugin._core.master_copy import fp32_master_copy
from precision_plugin.policy import PrecisionPolicy

mesh = init_device_mesh("cpu", (1,))
out = {}
for loaded in ("float32", "float16"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    model.to(getattr(torch, loaded))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
    master = fp32_master_copy(None, model)
    learner = {
        "trainable_params": {"float16": 108},  # what a reader inside the forward would see
        "loss_scaler": {"class": "ShardedGradScaler"},
        "fp32_master_weights": master,
    }
    out[loaded] = {
        "master": master,
        "forward": str(model(torch.randn(2, 8, dtype=getattr(torch, loaded))).dtype),
        "contradictions": sorted(contradictions(PrecisionPolicy(), learner, {})),
    }
dist.destroy_process_group()
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.mark.slow
def test_fsdp_mixed_precision_keeps_a_float32_master_copy(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    from tests.integration.ds_cpu import free_port

    result = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(free_port()), str(result)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(result.read_text())
    fp32 = out["float32"]
    assert fp32["master"] == (
        "FSDP2 MixedPrecisionPolicy(param_dtype=float16): sharded float32 parameters"
    )
    assert fp32["forward"] == "torch.float16" and fp32["contradictions"] == []
    assert out["float16"]["master"] is None  # loaded in float16: no float32 copy anywhere
    assert out["float16"]["contradictions"] == ["trainable"]
