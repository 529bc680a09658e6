"""Rollout engines for the probe: the interface and the built-in HF engine.

A rollout engine samples completions the way an RL rollout does and returns, for every sampled
token, the log-probability the engine itself assigned to it (temperature 1, full vocabulary,
no top-k/top-p), so it can be compared with the trainer's full-sequence log-softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class RolloutSample:
    """One sampled completion: prompt and completion token ids, and the engine's log-probs.

    ``logprobs[i]`` is the engine's log-probability of ``completion_ids[i]``; ``nan`` where the
    engine did not return one (such tokens are excluded and counted by the metrics).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    meta: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the probe needs from a rollout engine.

    Engines are built by a factory ``factory(model_path, dtype, device, seed) -> RolloutEngine``
    (returned by the ``precision_probe_engines`` hook); ``model_path`` is a local HF checkpoint
    directory, ``dtype`` a canonical name (``float16``/``bfloat16``/``float32``).
    """

    name: str

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, seed: int
    ) -> list[RolloutSample]:
        """Sample one completion per prompt (temperature 1) with the sampled tokens' log-probs."""
        ...

    def close(self) -> None:
        """Release the engine's memory (weights, KV cache, worker processes)."""
        ...


def load_causal_lm(model_path: str, device: str) -> tuple[Any, Any]:
    """Load a local HF causal-LM checkpoint in float32 on ``device``, in eval mode.

    Returns ``(model, tokenizer)``. Loads in float32 whatever the checkpoint's dtype, so callers
    decide the precision (``.to(dtype)`` for a rollout copy, autocast for the trainer path).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # transformers reports weights that do not fit the config as a multi-line warning table
    # and loads anyway, randomly initialised; here they are one error.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_path, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = list(info.get("missing_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    if missing or mismatched:
        first = (missing or [str(m[0]) if isinstance(m, tuple) else str(m) for m in mismatched])[0]
        raise ValueError(
            f"its weights do not match its config.json (model_type "
            f"{getattr(model.config, 'model_type', '?')!r}): {len(missing)} weight(s) missing "
            f"and {len(mismatched)} of another shape, e.g. {first!r}; they would be random. "
            f"Check model_type and the sizes in config.json"
        )
    model = model.to(device=device, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model, tokenizer


class HFRolloutEngine:
    """Rollout with HF ``generate``: its own copy of the weights in ``dtype``, KV-cache decoding.

    Samples token by token at temperature 1 over the full vocabulary (no top-k/top-p, no
    repetition penalty: the checkpoint's generation defaults are replaced). The log-prob of each
    sampled token is ``log_softmax`` in float32 of the engine's own ``dtype`` logits, as vLLM
    computes it. Prompts of equal length are batched without padding and with an all-ones
    attention mask, so position ids are ``0..T-1`` exactly as in a trainer's full forward.
    """

    name = "hf"

    def __init__(self, model: Any, dtype: str, device: str) -> None:
        import torch
        from transformers import GenerationConfig

        from precision_plugin.policy import torch_dtype

        self.dtype = dtype
        self.device = device
        self.model = model.to(device=device, dtype=torch_dtype(dtype)).eval()
        config = self.model.config
        self._eos: set[int] = set()
        # Some checkpoints name their EOS ids only in generation_config.json.
        for source in (config, getattr(self.model, "generation_config", None)):
            eos = getattr(source, "eos_token_id", None)
            self._eos.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = getattr(config, "pad_token_id", None)
        self._pad = pad if pad is not None else (min(self._eos) if self._eos else 0)
        # A fresh config: a checkpoint's generation_config.json (top_k=50, temperature=0.7,
        # repetition_penalty, ...) must not reshape the distribution we compare against.
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self._eos) or None, pad_token_id=self._pad
        )
        self._torch = torch

    @classmethod
    def from_pretrained(cls, model_path: str, dtype: str, device: str) -> HFRolloutEngine:
        """Load ``model_path`` and keep a ``dtype`` copy of its weights on ``device``."""
        model, _ = load_causal_lm(model_path, device)
        return cls(model, dtype, device)

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, seed: int
    ) -> list[RolloutSample]:
        """Sample one completion per prompt; a completion stops after its first EOS token."""
        torch = self._torch
        groups: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(len(prompt), []).append(i)
        out: list[RolloutSample | None] = [None] * len(prompts)
        dev = torch.device(self.device)
        devices = []
        if dev.type == "cuda":
            devices = [dev.index if dev.index is not None else torch.cuda.current_device()]
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(seed)
            for length in sorted(groups):
                rows = groups[length]
                ids = torch.tensor([prompts[i] for i in rows], device=self.device)
                samples = self._generate_batch(ids, max_new_tokens)
                for row, sample in zip(rows, samples, strict=True):
                    out[row] = sample
        return [s for s in out if s is not None]

    def _attention_mask(self, ids: Any) -> Any:
        """All ones, passed explicitly: ``generate`` would otherwise mask every pad-id token."""
        return self._torch.ones_like(ids)

    def _generate_batch(self, ids: Any, max_new_tokens: int) -> list[RolloutSample]:
        torch = self._torch
        result = self.model.generate(
            input_ids=ids,
            attention_mask=self._attention_mask(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = result.sequences[:, ids.shape[1] :]
        # One step at a time: stacking [batch, steps, vocab] would double the peak memory.
        token_logp = torch.stack(
            [
                torch.log_softmax(step.float(), dim=-1).gather(-1, new[:, t : t + 1]).squeeze(-1)
                for t, step in enumerate(result.logits[: new.shape[1]])
            ],
            dim=1,
        )
        samples = []
        for b in range(ids.shape[0]):
            tokens = new[b].tolist()
            end = next((t + 1 for t, tok in enumerate(tokens) if tok in self._eos), len(tokens))
            samples.append(
                RolloutSample(
                    prompt_ids=ids[b].tolist(),
                    completion_ids=tokens[:end],
                    logprobs=token_logp[b, :end].tolist(),
                    meta={"engine": self.name, "dtype": self.dtype},
                )
            )
        return samples

    def close(self) -> None:
        """Drop the weights (and the CUDA cache when on a GPU)."""
        self.model = None
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()


def hf_engine_factory(model_path: str, dtype: str, device: str, seed: int) -> HFRolloutEngine:
    """``precision_probe_engines`` factory of the built-in ``hf`` engine."""
    del seed  # sampling is seeded per generate() call
    return HFRolloutEngine.from_pretrained(model_path, dtype, device)
