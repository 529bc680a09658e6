"""CPU kernel settings and the thresholds of the tests' kernel-dependent statistics.

One place for both: the tests marked ``kernel_sensitive`` assert against ``THRESHOLDS``;
``scripts/kernel_margins.py`` measures the room each has under every setting of ``SETTINGS``;
``scripts/dev.sh test`` reruns those tests under the capped settings in separate processes (the
caps must be set before torch is imported).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment caps that make any x86 CPU compute with an older CPU's kernels: ``avx2`` is an
#: AVX2-only CPU (most AMD EPYC/Ryzen, pre-2017 Intel), ``floor`` torch's default (non-vector)
#: kernels with oneDNN at SSE4.1. ``native`` is the CPU as it is.
SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "floor": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}

#: Unit roundoff: float16 keeps 11 significant bits, bfloat16 8.
FP16_UNIT, BF16_UNIT = 2.0**-11, 2.0**-8
#: bfloat16 over float16 in a first-order quantity (a log-probability difference): 2^3 = 8.
FIRST_ORDER = BF16_UNIT / FP16_UNIT
#: ...and in a second-order one (k3 KL, the log-ratio's variance): 8^2 = 64.
SECOND_ORDER = FIRST_ORDER**2

#: The bfloat16/float16 ratio each test asserts. The theory gives the expected ratio; a test
#: measures it on a few hundred tokens, where it scatters about twofold either way between
#: seeds and kernel settings (scripts/kernel_margins.py: docs/results/kernel-margins.json), so
#: each threshold sits a power of two below the theory with at least 3x room from the lowest
#: ratio measured: k3 above the first-order factor (64/8), the mean |log-ratio| twice float16's
#: (8/4). The log-ratio's per-token variance is fitted from only 4 sequences: the ratio of two
#: sample variances with 3 degrees of freedom each falls below 1/29.5 of the true ratio with
#: probability 1% (the F(3, 3) distribution's 1st percentile), so it is asserted at 64/32.
THRESHOLDS: dict[str, float] = {
    "k3": SECOND_ORDER / 8,
    "logp_abs_diff": FIRST_ORDER / 4,
    "variance": SECOND_ORDER / 32,
}


#: The folder whose ``sitecustomize`` overrides the CPU's float16 capability in a subprocess.
FP16_OVERRIDE_DIR = Path(__file__).resolve().parent / "fp16_capability"
FP16_OVERRIDE_ENV = "PRECISION_PLUGIN_TEST_ONEDNN_FP16"


def fp16_override_env(fp16: bool, pythonpath: str | None = None) -> dict[str, str]:
    """Environment entries that make a subprocess's CPU report oneDNN float16 kernels (``fp16``
    true: DeepSpeed's CPU accelerator then runs fp16) or report none (it refuses fp16), whatever
    the CPU has; ``pythonpath`` is the subprocess's own ``PYTHONPATH``, kept after the override."""
    path = os.pathsep.join(p for p in (str(FP16_OVERRIDE_DIR), pythonpath) if p)
    return {"PYTHONPATH": path, FP16_OVERRIDE_ENV: "1" if fp16 else "0"}
