"""The sanity benchmark's field names, presets and thresholds, as data (read by the schema and
by the aggregate over seeds, which the schema calls: neither imports the other's module at
import time)."""

from __future__ import annotations

from typing import Any

#: Version of the JSON layout; bump when a field changes meaning.
SCHEMA_VERSION = 2
DEFAULT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
ENGINES: tuple[str, ...] = ("hf", "vllm")
#: Per-step fields, each read from the trainer's log history (None when it did not log it).
STEP_FIELDS: tuple[str, ...] = (
    "step", "reward", "accuracy", "k3_kl", "prob_diff_max", "loss_scale", "skipped_steps",
    "grad_cosine", "seq_log_ratio_abs", "telemetry",
)  # fmt: skip
#: The run's consequence metrics (``precision_plugin._core.metrics.consequence``, each step's
# ``telemetry``):
#: their means over the logged steps, and the worst step's effective sample size.
CONSEQUENCE_FIELDS: tuple[str, ...] = (
    "mean_ess", "min_ess", "mean_seq_mask_fraction_trl", "mean_seq_mask_fraction_verl",
    "mean_tis_clip_fraction",
)  # fmt: skip
#: Per-run summary fields (``*_accuracy`` are means over a window of ``window`` steps).
SUMMARY_FIELDS: tuple[str, ...] = (
    "window", "first_accuracy", "peak_accuracy", "final_accuracy", "collapsed",
    "mean_k3_kl", "max_prob_diff_max", "mean_grad_cosine", "min_grad_cosine",
    "mean_seq_log_ratio_abs", *CONSEQUENCE_FIELDS, "final_loss_scale", "skipped_steps",
    "nan_values", "seconds", "cpu_seconds",
)  # fmt: skip
#: A drop of the final window's accuracy this far below the run's best window is a collapse.
COLLAPSE_DROP = 0.2

#: What each preset sets; anything else keeps ``SanityConfig``'s defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "long": {
        "steps": 300,
        "seeds": (0, 1, 2),
        "model_size": "small",
        "learning_rate": 1e-3,
        "grad_cosine": True,
        "pretrain_learning_rate": 3e-3,
        "pretrain_batch_size": 32,
    },
}
