"""One strict reader of other programs' configurations, with a dialect per program.

```python
from precision_plugin._core.configs import OPENRLHF, VERL
OPENRLHF.read_argv(["--vllm.num_engines", "2", "--ds.param_dtype", "fp16"])
VERL.read_mapping(cfg, source="ppo.yaml")   # names 'actor_rollout_ref.rollout.dtype in ppo.yaml'
cfg = load("ppo.yaml", VERL)                 # parsed as OmegaConf does, then read strictly
```

See :mod:`precision_plugin._core.configs.reader` for what reading checks and
:mod:`precision_plugin._core.configs.values` for each program family's value rules.
"""

from __future__ import annotations

from precision_plugin._core.configs.files import load
from precision_plugin._core.configs.programs import (
    AREAL,
    DIALECTS,
    MEGATRON,
    OPENRLHF,
    SGLANG,
    SLIME,
    TRL,
    VERL,
)
from precision_plugin._core.configs.reader import Dialect, Key, Pair, parse_override

__all__ = [
    "AREAL",
    "DIALECTS",
    "MEGATRON",
    "OPENRLHF",
    "SGLANG",
    "SLIME",
    "TRL",
    "VERL",
    "Dialect",
    "Key",
    "Pair",
    "load",
    "parse_override",
]
