"""Test support: override the CPU's float16 capability for DeepSpeed in a subprocess (never the
package).

DeepSpeed's CPU accelerator runs an fp16 engine only where oneDNN has native fp16 kernels
(``CPU_Accelerator.is_fp16_supported``: ``torch.ops.mkldnn._is_mkldnn_fp16_supported()``,
AVX512-FP16 / AMX-FP16 CPUs); the plugin asks that accelerator too. To run both branches on any
CPU, a test puts this folder first on ``PYTHONPATH`` and sets ``PRECISION_PLUGIN_TEST_ONEDNN_FP16``
to ``1`` (the fp16 branch on a CPU without those kernels: torch computes fp16 on any CPU, only
slower) or ``0`` (the refusing branch on a CPU with them). Python imports this module at start-up
(``site``); it patches nothing until DeepSpeed's CPU accelerator module is imported, then
replaces only that one method, so every process of a launcher (``accelerate launch``,
``torchrun``) inherits the same answer. Unset, it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

ENV = "PRECISION_PLUGIN_TEST_ONEDNN_FP16"
MODULE = "deepspeed.accelerator.cpu_accelerator"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the accelerator module's loader so the override follows."""

    def __init__(self, forced: bool) -> None:
        self.forced = forced

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        original, forced = spec.loader.exec_module, self.forced

        def exec_module(module):
            original(module)
            module.CPU_Accelerator.is_fp16_supported = lambda self: forced

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(ENV) in ("0", "1") and MODULE not in sys.modules:
    sys.meta_path.insert(0, _AfterImport(os.environ[ENV] == "1"))
