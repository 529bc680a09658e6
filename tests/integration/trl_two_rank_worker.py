"""Worker for test_trl_multiprocess: a real GRPO run (with the tensors each ``_compute_loss``
call received), then a fixed batch through the same trainer's telemetry reduction; writes
``rank<r>.json`` into the folder given as argv[1].

    python -m torch.distributed.run --nproc-per-node=N -m tests.integration.trl_two_rank_worker OUT
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from tests.integration import ds_cpu

ROOT = Path(__file__).resolve().parents[2]
ROWS, WIDTH = 8, 12


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same ragged batch of (train, rollout, mask) on every rank, with one NaN token and a
    mismatch large enough that the sequence masks and the TIS clip act on some rows."""
    g = torch.Generator().manual_seed(7)
    train = -4.0 * torch.rand(ROWS, WIDTH, generator=g, dtype=torch.float64) - 2.0  # <= 0
    rollout = train + 0.4 * torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64)
    lengths = torch.randint(2, WIDTH + 1, (ROWS,), generator=g)
    mask = torch.arange(WIDTH)[None, :] < lengths[:, None]
    rollout[5, 1] = float("nan")
    return train, rollout, mask


def main(out: Path) -> None:
    import precision_plugin as pp
    from precision_plugin.trl import telemetry as trl_telemetry

    spec = importlib.util.spec_from_file_location("recipe", ROOT / "integrations/trl/grpo_fp16.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)

    from tests.integration.test_trl_telemetry import _spy

    pp.enable()
    trainer = recipe.build_trainer(str(out / "run"), 2)
    calls = _spy(trainer)  # what each _compute_loss call of this rank receives
    trainer.train()
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    tensors = [{k: v.tolist() for k, v in call.items()} for call in calls]
    logs = [
        {k: v for k, v in h.items() if k.startswith(("precision/", "completions/mean_length"))}
        for h in trainer.state.log_history
        if "loss" in h
    ]

    # The same batch split across the processes, reduced by the trainer's own accelerator.
    train, rollout, mask = fixed_batch()
    acc = trl_telemetry.MismatchAccumulator()
    setattr(trainer, trl_telemetry.ATTR, acc)
    rows = list(range(rank, ROWS, world))
    for row in rows:  # one micro-batch per row, as TRL's slices arrive
        acc.add(train[row : row + 1], rollout[row : row + 1], mask[row : row + 1])
    fixed = trl_telemetry.flush(trainer)
    pp.disable()
    result = {"rank": rank, "world": world, "logs": logs, "fixed": fixed, "calls": tensors}
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    ds_cpu.exit_rank()
