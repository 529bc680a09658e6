"""A minimal Accelerate training loop under precision_plugin (tiny in-code model, no downloads).

    accelerate launch --config_file integrations/accelerate/fp16.yaml \
        integrations/accelerate/train_fp16.py --steps 20
    accelerate launch --config_file integrations/accelerate/deepspeed_zero2_fp16.yaml \
        integrations/accelerate/train_fp16.py --steps 20

The policy is ``--dtype``, else ``PRECISION_PLUGIN``, else (under a DeepSpeed config file) that
file's ``"precision_plugin"`` section, else float16: with a DeepSpeed file the one file decides the
dtype of both the plugin and DeepSpeed. Prints one JSON line: the dtype the forward ran in, the
loss scale, skipped steps.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator

import precision_plugin as pp
from precision_plugin.accelerate import accelerator_stats
from precision_plugin.cli.argtypes import positive_int
from precision_plugin.deepspeed import config_policy, engine_dtype, engine_scaler_stats


def the_policy(dtype: str | None, growth_interval: int | None) -> pp.PrecisionPolicy:
    """``PRECISION_PLUGIN`` or the defaults, then the DeepSpeed file's section (``accelerate
    launch`` names the file), then ``--dtype`` and ``--growth-interval``."""
    ds_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if ds_file:
        policy = config_policy(json.loads(Path(ds_file).read_text()))
    else:
        policy = pp.PrecisionPolicy.from_env() or pp.PrecisionPolicy()
    if dtype:
        policy = policy.replace(dtype=dtype)
    if growth_interval:
        policy = policy.replace(loss_scaler={"growth_interval": growth_interval})
    return policy


def main() -> None:
    """Train a tiny MLP for ``--steps`` steps and report what ran."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--growth-interval", type=positive_int, help="default: the policy's (400)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"])
    options = parser.parse_args()

    pp.enable(the_policy(options.dtype, options.growth_interval))
    accelerator = Accelerator()  # mixed_precision comes from the policy
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(8 * options.steps, 16)
    # DeepSpeed takes its micro-batch size from the dataloader Accelerate prepares.
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    dtype = next(p.dtype for p in model.parameters())
    for (x,) in loader:
        x = x.to(dtype)  # DeepSpeed holds 16-bit weights and does not cast inputs
        loss = (model(x).float() - x.float().sum(dim=1, keepdim=True)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    engine = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if engine is not None:
        stats = engine_scaler_stats(engine.engine)
        runs = engine_dtype(engine.engine)  # float32 where DeepSpeed refuses the policy's
    else:
        stats = accelerator_stats(accelerator)
        runs = pp.current_policy().dtype
    report = {
        "accelerate_mixed_precision": accelerator.mixed_precision,  # asked of Accelerate
        "engine_dtype": runs,
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
    try:
        main()
    except pp.PrecisionPluginError as stop:  # a strict stop: its one line, not a traceback
        raise SystemExit(f"{Path(__file__).name}: stopped: {stop}") from None
