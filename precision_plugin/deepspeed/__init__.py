"""DeepSpeed adapter: the ``"precision_plugin"`` config entry, applied wherever DeepSpeed starts.

Public API:

- [`apply_config`][precision_plugin.deepspeed.apply_config] (pure): a DeepSpeed config with its
  ``"precision_plugin"`` section turned into DeepSpeed's own ``fp16``/``bf16`` settings.
- [`engine_scaler_stats`][precision_plugin.deepspeed.engine_scaler_stats]: the engine's loss scale
  and skipped steps as a [`ScalerStats`][precision_plugin._core.scaler.ScalerStats], whatever the
  ZeRO
  stage.
- [`engine_dtype`][precision_plugin.deepspeed.engine_dtype]: the dtype the plugin runs an engine
  in (the policy's, or float32 where DeepSpeed's accelerator refuses it).
- [`track_engine`][precision_plugin.deepspeed.track_engine]: per-step telemetry and the
  loss-scale-floor check for one engine (``enable()`` does it for every engine
  ``deepspeed.initialize`` builds).

After ``enable()``, the entry is applied by ``deepspeed.initialize`` itself, whether it is
called directly (``config=`` dict or path, or ``args.deepspeed_config``), by Accelerate
(``DeepSpeedPlugin``, ``accelerator.prepare``) or by the HF Trainer (``--deepspeed file.json``);
the HF Trainer's and Accelerate's own precision requests are reconciled with the policy first.

The package, by concern: ``config`` (the entry's pure translation, of a resolved policy),
``api`` (the public functions, which resolve the policy once), ``install`` (where it is
applied), ``telemetry`` (loss-scale tracking and the floor rule), ``doctor`` and ``adapter``
(the hooks). DeepSpeed itself is imported lazily.
"""

from precision_plugin.deepspeed.api import apply_config, config_policy, translate
from precision_plugin.deepspeed.config import SECTION, load_config
from precision_plugin.deepspeed.telemetry import engine_dtype, engine_scaler_stats, track_engine

__all__ = [
    "SECTION",
    "apply_config",
    "config_policy",
    "engine_dtype",
    "engine_scaler_stats",
    "load_config",
    "track_engine",
    "translate",
]
