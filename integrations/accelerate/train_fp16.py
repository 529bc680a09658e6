"""A minimal Accelerate training loop under precision_plugin (tiny in-code model, no downloads).

    accelerate launch --config_file integrations/accelerate/fp16.yaml \
        integrations/accelerate/train_fp16.py --steps 20

Prints one JSON line: the dtype the forward ran in, the loss scale, skipped steps.
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator

import precision_plugin as pp
from precision_plugin.accelerate import accelerator_stats


def main() -> None:
    """Train a tiny MLP for ``--steps`` steps and report what ran."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--growth-interval", type=int, default=400)
    options = parser.parse_args()

    pp.enable(loss_scaler={"growth_interval": options.growth_interval})
    accelerator = Accelerator()  # mixed_precision comes from the config file (fp16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(options.steps):
        x = torch.randn(8, 16, device=accelerator.device)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    stats = accelerator_stats(accelerator)
    report = {
        "mixed_precision": accelerator.mixed_precision,
        "forward_dtype": str(seen[-1]).removeprefix("torch."),
        "loss_scale": stats.scale if stats else None,
        "growth_interval": accelerator.scaler.get_growth_interval() if accelerator.scaler else None,
        "steps": stats.steps if stats else 0,
        "skipped_steps": stats.skipped_steps if stats else 0,
        "final_loss": float(loss.detach()),
    }
    if accelerator.is_main_process:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
