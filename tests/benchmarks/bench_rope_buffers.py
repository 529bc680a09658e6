"""The probe with the rollout copy's RoPE frequencies in float32 (as vLLM keeps them) and rounded.

    .venv/bin/python tests/benchmarks/bench_rope_buffers.py [--tokens 256,1024]
        [--num-prompts 16] [--seed 0] [--json FILE]

For each length the default probe (embedded model, CPU, float32/float16/bfloat16) runs twice on
the same prompts and seeds: once as the probe runs (the HF engine's copy keeps the buffers vLLM
keeps in float32, ``precision_plugin._core.buffers``) and once with a plain ``.to(dtype)`` that rounds
them too (what the rollout copy did before). The trainer side is the same in both. Prints one
line per run; ``--json FILE`` writes the results with their provenance (the bf16/fp16 k3 ratio
against the rounding theory's ~64x, and each dtype's k3 and drift per 1K tokens). A script, not
a test: pytest does not collect it.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

#: The rounding theory: unit roundoff 2^-8 (bfloat16) vs 2^-11 (float16), k3 quadratic in it.
THEORY_RATIO = 64.0


def run(tokens: int, num_prompts: int, seed: int, float32_buffers: bool) -> dict[str, Any]:
    """One probe run; the figures the comparison needs."""
    from precision_plugin.probe import ProbeConfig, hf_engine_factory, run_probe

    factory = functools.partial(hf_engine_factory, float32_buffers=float32_buffers)
    result = run_probe(
        ProbeConfig(num_prompts=num_prompts, max_new_tokens=tokens, seed=seed, device="cpu"),
        engines={"hf": factory},
    )
    if not result.valid:
        raise SystemExit(f"float32 self-check failed: {result.self_check.message}")
    dtypes = {}
    for name, r in result.results.items():
        m = r.metrics
        dtypes[name] = {
            "k3_kl": m.k3_kl,
            "k1_kl": m.k1_kl,
            "drift_per_1k": m.drift_per_1k,
            "drift_per_1k_se": m.drift_per_1k_se,
            "prob_diff_mean": m.prob_diff_mean,
            "tokens": m.tokens,
        }
    return {
        "max_new_tokens": tokens,
        "rope_float32": float32_buffers,
        "bf16_over_fp16_k3": result.k3_ratio("bfloat16", "float16"),
        "dtypes": dtypes,
        "seconds": round(result.seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print a line per run, write ``--json`` with its provenance."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="256,1024", help="comma list of --max-new-tokens")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write the results with provenance")
    args = parser.parse_args(argv)
    runs = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for keep in (False, True):
            entry = run(tokens, args.num_prompts, args.seed, keep)
            runs.append(entry)
            fp16 = entry["dtypes"]["float16"]
            print(
                f"{tokens:>5} tokens, RoPE frequencies {'float32' if keep else 'rounded'}: "
                f"bf16/fp16 k3 {entry['bf16_over_fp16_k3']:.1f}x, fp16 k3 {fp16['k3_kl']:.3g}, "
                f"{entry['seconds']} s",
                flush=True,
            )
    rounded = {r["max_new_tokens"]: r for r in runs if not r["rope_float32"]}
    kept = {r["max_new_tokens"]: r for r in runs if r["rope_float32"]}
    lengths = {
        str(n): {
            "ratio_rounded": rounded[n]["bf16_over_fp16_k3"],
            "ratio_float32": kept[n]["bf16_over_fp16_k3"],
            # how much of the rounded copy's float16 k3 was the frequency rounding
            "fp16_k3_share_of_rounding": 1.0
            - kept[n]["dtypes"]["float16"]["k3_kl"] / rounded[n]["dtypes"]["float16"]["k3_kl"],
        }
        for n in kept
    }
    data = {"theory_ratio": THEORY_RATIO, "lengths": lengths, "runs": runs}
    if args.json:
        from precision_plugin._base.provenance import write_results

        given = sys.argv[1:] if argv is None else argv
        command = ["python", "tests/benchmarks/bench_rope_buffers.py", *given]
        write_results(args.json, data, command)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
