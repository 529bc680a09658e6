"""One rank of the two-process DeepSpeed test (launched by torchrun from
test_deepspeed_multiprocess.py). For each ZeRO stage: train a few steps, poison only rank 0's
loss on one step, and write per-step records plus the final parameters to ``<out>/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import precision_plugin as pp
from precision_plugin.deepspeed import engine_scaler_stats
from tests.integration import ds_cpu

STEPS = 5
POISONED_STEP = 2  # on rank 0 only


def run_stage(deepspeed, stage: int, rank: int) -> dict:
    model = ds_cpu.tiny_model(seed=0)
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
        config=ds_cpu.ds_config(stage),
    )
    records = []
    for step in range(STEPS):
        inject = "inf" if (step == POISONED_STEP and rank == 0) else None
        ds_cpu.train_step(engine, inject=inject, seed=1000 * rank + step)  # different data per rank
        stats = engine_scaler_stats(engine)
        records.append(
            {
                "applied": engine.was_step_applied(),
                "scale": stats.scale,
                "skipped": stats.skipped_steps,
            }
        )
    params = [p.flatten().tolist() for p in ds_cpu.full_params(engine)]
    return {
        "fp16": engine.fp16_enabled(),
        "bf16": engine.bfloat16_enabled(),
        "records": records,
        "params": params,
    }


def main() -> None:
    out_dir, stages = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    rank = int(os.environ["RANK"])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    ds_cpu.allow_fp16_on_cpu()
    pp.enable()
    result = {str(stage): run_stage(deepspeed, stage, rank) for stage in stages}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
    ds_cpu.exit_rank()
