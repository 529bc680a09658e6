"""Cost of runtime overflow detection per training step: off vs sampled every 10 steps.

    .venv/bin/python tests/benchmarks/bench_overflow_detection.py [--blocks 15] [--json]

A small Llama (default 2 layers, hidden 128, batch 2 x 64 tokens, one CPU thread: several
threads on a shared 2-core machine mostly measure contention), fp16 autocast, the plugin's
loss scaler, AdamW. Three setups train identical copies, interleaved in blocks of ``--every``
steps so drift of the machine hits all alike: detection ``off``, ``sampled`` (one checked step per
block, as ``overflow.detect="sampled"`` with ``detect_every=10`` runs it) and ``always`` (every
step checked: the price of one checked step). The figure that matters is the median block time,
sampled against off. A script, not a test: pytest does not collect it, no speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

import torch

from precision_plugin import PrecisionPolicy
from precision_plugin.overflow import OverflowDetector
from precision_plugin.scaler import make_grad_scaler


def _model(layers: int, hidden: int, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config).to(device)


class _Setup:
    def __init__(self, mode: str, options: argparse.Namespace) -> None:
        self.device = options.device
        self.model = _model(options.layers, options.hidden, self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        policy = PrecisionPolicy(loss_scaler={"init_scale": 2.0**10})
        self.scaler = make_grad_scaler(policy, self.device)
        self.detector = OverflowDetector(self.model, mode=mode, every=options.every)
        self.step_no = 0

    def step(self, batch: torch.Tensor, sync) -> None:
        with self.detector.step(self.step_no):
            with torch.autocast(self.device, dtype=torch.float16):
                loss = self.model(input_ids=batch, labels=batch).loss
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        sync()
        self.step_no += 1


def main() -> dict:
    """Measure; print a table (or one JSON line with --json); return the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=15, help="measured blocks per setup")
    parser.add_argument("--every", type=int, default=10, help="sampling interval = block size")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    sync = torch.cuda.synchronize if options.device == "cuda" else (lambda: None)
    setups = {mode: _Setup(mode, options) for mode in ("off", "sampled", "always")}
    random.seed(0)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 512, (options.batch, options.seq), generator=gen).to(options.device)
    for setup in setups.values():  # warm-up: one block each
        for _ in range(options.every):
            setup.step(batch, sync)
    blocks: dict[str, list[float]] = {mode: [] for mode in setups}
    order = list(setups)
    for _ in range(options.blocks):
        random.shuffle(order)  # no setup always runs first (or right after another) in a round
        for mode in order:
            setup = setups[mode]
            t0 = time.perf_counter()
            for _ in range(options.every):
                setup.step(batch, sync)
            blocks[mode].append((time.perf_counter() - t0) / options.every)
    med = {mode: statistics.median(v) for mode, v in blocks.items()}
    result = {
        "device": options.device,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "model": f"llama {options.layers}x{options.hidden}, batch {options.batch}x{options.seq}",
        "modules_hooked": sum(1 for _ in setups["off"].model.modules()),
        "threads": options.threads,
        "every": options.every,
        "blocks": options.blocks,
        "step_median_s": med,
        "sampled_overhead_pct": 100 * (med["sampled"] - med["off"]) / med["off"],
        "checked_step_overhead_pct": 100 * (med["always"] - med["off"]) / med["off"],
    }
    # What one checked step costs, spread over the sampling interval: the same figure as
    # sampled-vs-off with less noise (the difference of two medians of whole blocks is noisy).
    result["sampled_overhead_pct_from_checked"] = (
        result["checked_step_overhead_pct"] / options.every
    )
    if options.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['model']}, {result['modules_hooked']} modules, {options.device}, "
            f"{options.blocks} blocks of {options.every} steps"
        )
        print(f"{'detection':<22}{'median step':>14}{'vs off':>10}")
        for mode, label in (
            ("off", "off"),
            ("sampled", f"sampled every {options.every}"),
            ("always", "every step"),
        ):
            pct = 100 * (med[mode] - med["off"]) / med["off"]
            print(f"{label:<22}{med[mode] * 1e3:>11.2f} ms{pct:>+9.2f}%")
        print(
            f"one checked step spread over {options.every} steps: "
            f"{result['sampled_overhead_pct_from_checked']:+.2f}% per step"
        )
    return result


if __name__ == "__main__":
    main()
