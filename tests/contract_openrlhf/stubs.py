"""What cannot run on a CPU machine, stubbed for the OpenRLHF contract tests (and only that).

- ``flash_attn``: OpenRLHF hard-requires flash-attn 2.8.3, a CUDA build. ``openrlhf.models``
  imports ``flash_attn.bert_padding`` and ``flash_attn.utils.distributed`` at module level for
  ring attention; the stub provides those names, which nothing on the tested paths calls.
- vLLM's engine core, which needs a GPU: :func:`stop_at_engine` replaces
  ``AsyncLLM.__init__`` (what ``AsyncLLMEngine.from_engine_args`` calls once vLLM's real
  ``EngineArgs.create_engine_config()`` has resolved the config) with a recorder that writes what
  the engine would run to ``$PP_TEST_CAPTURE/engine-<pid>.json``. In Ray actors it is installed
  as the job's ``worker_process_setup_hook``.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types


def install_flash_attn() -> None:
    """Put a ``flash_attn`` stub in ``sys.modules`` (idempotent)."""
    if "flash_attn" in sys.modules:
        return
    names = ("flash_attn", "flash_attn.bert_padding", "flash_attn.utils")
    modules = {name: types.ModuleType(name) for name in (*names, "flash_attn.utils.distributed")}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["flash_attn"].__version__ = "2.8.3"
    for name in ("pad_input", "unpad_input", "index_first_axis", "rearrange"):
        setattr(modules["flash_attn.bert_padding"], name, _not_on_cpu)
    modules["flash_attn.utils.distributed"].all_gather = _not_on_cpu
    sys.modules.update(modules)


def _not_on_cpu(*args, **kwargs):
    raise RuntimeError("flash-attn is stubbed in the CPU contract tests")


def stop_at_engine() -> None:
    """Record, instead of starting, every vLLM engine this process builds."""
    from vllm.v1.engine.async_llm import AsyncLLM

    def __init__(self, vllm_config, executor_class, **kwargs):
        record = {
            "pid": os.getpid(),
            "dtype": str(vllm_config.model_config.dtype),
            "model": vllm_config.model_config.model,
            "worker_extension_cls": vllm_config.parallel_config.worker_extension_cls,
            "precision_plugin_env": os.environ.get("PRECISION_PLUGIN"),
        }
        folder = os.environ["PP_TEST_CAPTURE"]
        with open(os.path.join(folder, f"engine-{os.getpid()}.json"), "w") as out:
            json.dump(record, out)

    async def is_sleeping(self):
        return False

    AsyncLLM.__init__ = __init__
    AsyncLLM.is_sleeping = is_sleeping
    AsyncLLM.__del__ = lambda self: None
