"""``HFRollout``: a GRPO rollout engine in the policy dtype, without vLLM.

``GRPOTrainer(..., rollout_func=HFRollout())`` samples with the probe's HF engine
([`HFRolloutEngine`][precision_plugin._core.hf_engine.HFRolloutEngine]) over an inference copy of
the policy, so the rollout → trainer mismatch path (and its telemetry) is real on CPU, in CI
and on GPUs too small for vLLM.
"""

from __future__ import annotations

import copy
import logging
import zlib
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import Invalid, Validator, at_least, checked, dtype_name, duck
from precision_plugin._core.sampling import SamplingSettings
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")


def _rollout_trainer(trainer: Any) -> Any:
    """The boundary check of the trainer calling ``HFRollout``: a GRPO trainer whose generation
    settings can be sampled (TRL divides the logits by the temperature; a completion needs a
    token)."""
    missing = [a for a in ("args", "state", "accelerator") if not hasattr(trainer, a)]
    if missing:
        raise Invalid(
            f"is not the GRPOTrainer calling its rollout_func (it has no {', '.join(missing)}); "
            f"TRL calls rollout_func(prompts, trainer): pass HFRollout() as "
            f"GRPOTrainer(rollout_func=...)"
        )
    args = trainer.args
    for value in (getattr(trainer, "temperature", None), getattr(args, "temperature", None)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise Invalid(
                f"samples at temperature={value!r} ({type(args).__name__}.temperature): GRPO "
                f"divides the logits by it, so it must be a number > 0 (1.0 samples the model "
                f"as it is); set temperature=1.0, or a small value such as 0.1 for near-greedy"
            )
    length = getattr(args, "max_completion_length", None)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise Invalid(
            f"has max_completion_length={length!r} ({type(args).__name__}): every completion "
            f"needs at least one token; set an integer >= 1, e.g. 256"
        )
    return trainer


@checked(
    dtype=dtype_name,
    seed=at_least(0, why="a sampling seed"),
    max_batch=at_least(1, why="sequences per forward"),
)
class HFRollout:
    """A TRL ``rollout_func``: KV-cache sampling from a ``dtype`` copy of the learner.

    Follows TRL 1.16's ``rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids",
    "logprobs"}`` contract: one completion per prompt (TRL's sampler already repeats each
    prompt ``num_generations`` times), tokenized as TRL tokenizes them (chat template included),
    sampled for at most ``max_completion_length`` tokens with the trainer's sampling settings
    applied as TRL's vLLM path applies them (``temperature``, ``top_p``, ``top_k``, ``min_p``,
    ``repetition_penalty``, then ``generation_kwargs`` over them; see
    [`sampling_settings`][precision_plugin.trl.rollout.sampling_settings]), recording each sampled
    token's log-prob under the distribution it was drawn from (vLLM's ``processed_logprobs``,
    what TRL asks vLLM for). The inference copy is built on the first call and refreshed from
    the learner whenever the optimizer has stepped since (TRL's own rule for syncing vLLM), by a
    ``.to(dtype)`` of the learner's (fp32 master) weights, the same rounding vLLM applies when it
    loads them, with the buffers vLLM keeps in float32 kept in float32
    ([`precision_plugin._core.buffers`][precision_plugin._core.buffers]). ``dtype`` defaults to the
    active
    policy's ([`resolve_policy()`][precision_plugin._core.manager.resolve_policy]). ``max_batch``:
    at most this many sequences per forward (``1``: every sequence sampled and scored alone, a
    batch-invariant engine by construction, precision level 2; default: the whole batch at once,
    left padded).
    """

    def __init__(
        self,
        dtype: str | None = None,
        *,
        policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
        seed: int | None = None,
        max_batch: int | None = None,
    ) -> None:
        from precision_plugin._core.manager import resolve_policy

        self.max_batch = max_batch

        self._policy = policy  # a PrecisionPolicy (the boundary built it) or None
        self._dtype = dtype  # canonical: the boundary's dtype_name
        self._seed = seed
        self.engine: Any = None
        self.synced_step: int | None = None
        self.syncs = 0
        self._calls = 0
        self._resolve = resolve_policy

    @property
    def dtype(self) -> str:
        """The dtype the rollout copy runs in (``float16``, ``bfloat16`` or ``float32``)."""
        # With no dtype or policy given, ambient on purpose: TRL calls rollout_func(prompts,
        # trainer) with no way to pass a policy, and the rollout is often built before enable()
        # (as TRL's colocated vLLM is): it follows the policy this process asks for when it
        # samples.
        return self._dtype or self._resolve(self._policy).dtype

    @checked(trainer=Validator("the GRPOTrainer calling its rollout_func", _rollout_trainer))
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Sample one completion per prompt; TRL's ``rollout_func`` contract."""
        sampling, max_tokens = sampling_settings(trainer)
        self._sync(trainer)
        prompt_ids = self._tokenize(prompts, trainer)
        args = trainer.args
        base = args.seed if self._seed is None else self._seed
        process = getattr(trainer.accelerator, "process_index", 0)
        seed = zlib.crc32(f"{base}:{trainer.state.global_step}:{process}:{self._calls}".encode())
        self._calls += 1
        samples = self.generate_batch(prompt_ids, max_tokens, seed, sampling=sampling)
        return {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": [s.logprobs for s in samples],
        }

    def generate_batch(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        seed: int,
        *,
        sampling: SamplingSettings | None = None,
    ) -> list[Any]:
        """The engine's ``generate`` in batches of at most ``max_batch`` (prompt ``i`` samples
        with seed ``seed + i`` wherever it lands, as the engine does in one batch)."""
        size = self.max_batch or max(1, len(prompts))
        samples: list[Any] = []
        for first in range(0, len(prompts), size):
            chunk = prompts[first : first + size]
            samples.extend(self.engine.generate(chunk, max_tokens, seed + first, sampling=sampling))
        return samples

    def _tokenize(self, prompts: list[Any], trainer: Any) -> list[list[int]]:
        tokenize = getattr(trainer, "_tokenize_prompts", None)  # TRL's own (chat template, tools)
        if tokenize is not None:
            return [list(map(int, ids)) for ids in tokenize(prompts)[0]]
        tokenizer = trainer.processing_class
        return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def _sync(self, trainer: Any) -> None:
        """Build or refresh the inference copy when the learner's weights moved."""
        import torch

        from precision_plugin._core.buffers import keeps_float32
        from precision_plugin.policy import torch_dtype

        step = trainer.state.global_step
        if self.engine is not None and step == self.synced_step:
            return
        learner = trainer.accelerator.unwrap_model(trainer.model)
        device = str(trainer.accelerator.device)
        if self.engine is None:
            from precision_plugin._core.hf_engine import HFRolloutEngine
            from precision_plugin.errors import PrecisionConfigError

            quantization = getattr(getattr(learner, "config", None), "quantization_config", None)
            if quantization is not None:
                raise PrecisionConfigError(
                    f"HFRollout: the model is quantized ({type(quantization).__name__}), and a "
                    f"quantized model cannot be copied into {self.dtype}. Fix: sample with vLLM "
                    f"(use_vllm=True) or TRL's own generate (no rollout_func) for QLoRA."
                )

            self.engine = HFRolloutEngine(_inference_copy(learner), self.dtype, device, copy=False)
            self._sources = {**dict(learner.named_parameters()), **dict(learner.named_buffers())}
        else:
            wanted = torch_dtype(self.dtype)
            with torch.no_grad():
                for name, tensor in self.engine.model.state_dict(keep_vars=True).items():
                    source = self._sources.get(name)
                    if source is not None and tensor.is_floating_point():
                        # vLLM's cast of the fp32 masters; its float32 buffers stay float32
                        kept = keeps_float32(name) and tensor.dtype == torch.float32
                        tensor.copy_(source.detach() if kept else source.detach().to(wanted))
        self.synced_step = step
        self.syncs += 1


#: The trainer's sampling settings TRL's vLLM path passes to ``SamplingParams`` (TRL 1.16
#: ``trl/generation/vllm_generation.py``, ``VLLMGeneration.generate``).
TRAINER_SETTINGS: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
#: The ``generation_kwargs`` keys HFRollout applies (vLLM ``SamplingParams`` names, as TRL's
#: vLLM path passes them); any other key is refused.
GENERATION_KWARGS: tuple[str, ...] = (
    *TRAINER_SETTINGS,
    "frequency_penalty",
    "presence_penalty",
    "max_tokens",
)


@checked(trainer=duck("args", what="a TRL GRPOTrainer (its args hold the sampling settings)"))
def sampling_settings(trainer: Any) -> tuple[SamplingSettings, int]:
    """The trainer's sampling settings as TRL's vLLM path builds them, and the token budget.

    TRL 1.16 (colocate mode) passes the trainer's ``temperature``, ``top_p``, ``top_k``,
    ``min_p`` (``None`` as 0) and ``repetition_penalty`` with ``max_tokens =
    max_completion_length``, then updates them with ``args.generation_kwargs``; the log-probs are
    vLLM's ``processed_logprobs``. A ``generation_kwargs`` key HFRollout cannot apply (``stop``,
    ``seed``, ``n``, ...) is refused with
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError], never ignored.
    """
    from precision_plugin.errors import PrecisionConfigError

    args = trainer.args
    values: dict[str, Any] = {
        name: getattr(trainer, name, getattr(args, name, None)) for name in TRAINER_SETTINGS
    }
    from precision_plugin._core.configs import TRL

    source = type(args).__name__
    length = TRL.value(
        "max_completion_length", getattr(args, "max_completion_length", None), source
    )
    if length is None or length < 1:
        raise PrecisionConfigError(
            f"TRL: max_completion_length in {source} is {length!r}: every completion is sampled "
            f"for at most that many tokens, so it must be an integer >= 1; set it, e.g. 256."
        )
    values["max_tokens"] = length
    extra = TRL.value("generation_kwargs", getattr(args, "generation_kwargs", None) or {}, source)
    if "max_tokens" in extra:
        tokens = TRL.value("max_completion_length", extra["max_tokens"], source)
        if tokens is None or tokens < 1:
            raise PrecisionConfigError(
                f"TRL: generation_kwargs['max_tokens'] in {source} is {extra['max_tokens']!r}, "
                f"which vLLM's SamplingParams refuses (max_tokens must be at least 1); drop it "
                f"(max_completion_length sets it) or set an integer >= 1."
            )
    unknown = sorted(set(extra) - set(GENERATION_KWARGS))
    if unknown:
        raise PrecisionConfigError(
            f"HFRollout: generation_kwargs {unknown} cannot be applied; HFRollout applies "
            f"{', '.join(GENERATION_KWARGS)} exactly as vLLM does and refuses the rest rather "
            f"than ignore them. Fix: drop {unknown} from GRPOConfig.generation_kwargs, or sample "
            f"with vLLM (use_vllm=True)."
        )
    values.update(extra)
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0}  # fmt: skip
    for name, default in defaults.items():
        if values.get(name) is None:
            values[name] = default
    max_tokens = values.pop("max_tokens")
    return SamplingSettings(**values, logprobs_mode="processed_logprobs"), int(max_tokens)


def _inference_copy(learner: Any) -> Any:
    """A deep copy of the learner without what the trainer attached to the original.

    Accelerate (autocast, fp32 outputs) and TRL (fused LM head) replace ``forward`` on the
    instance with closures over the *original* model: a copy would run the learner. Forward
    hooks (the plugin's forward-dtype probe) are dropped too.
    """
    clone = copy.deepcopy(learner)
    for module in clone.modules():
        module.__dict__.pop("forward", None)
        module.__dict__.pop("_original_forward", None)
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
    for param in clone.parameters():
        param.requires_grad_(False)
    return clone
