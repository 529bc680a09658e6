"""The drift canary and the precision level in a TRL GRPO run.

The canary set is the first rollout batches ``GRPOTrainer._compute_loss`` sees (their prompt
and completion ids, padding removed), ``CANARY_SEQUENCES`` sequences. Every
``metrics.canary_every`` optimizer steps (checked at the first mismatch log at or after a due
step; the first check, at the first log with a full set, is the floor):

1. the rollout engine refreshes its weights as it would before its next generation (HFRollout's
   ``_sync``; TRL's ``vllm_generation.sync_weights()`` when the step moved, which TRL then does
   not repeat) and scores the canary through its own scoring path:
   - ``HFRollout``: a prefill of its inference copy
     ([`HFScorer`][precision_plugin._core.scoring.HFScorer]);
   - colocated vLLM: ``LLM.generate(..., SamplingParams(max_tokens=1, prompt_logprobs=1,
     temperature=1.0))`` ([`VLLMScorer`][precision_plugin._core.scoring.vllm.VLLMScorer]);
   - vLLM server mode: TRL's ``VLLMClient.get_sequence_logprobs`` (feature-detected; TRL builds
     without it log once that the canary is off);
2. the learner scores it at its current weights, in the dtype its forward runs in, and (float32
   master weights under autocast) in float32 too: the precision reference the band divides by,
   so the rounding growing or shrinking as training moves the weights is not an alarm;
3. [`CanaryMonitor`][precision_plugin._core.canary.CanaryMonitor] records both and decides.

Logged: ``precision/canary_k3``, ``canary_bitwise_equal_frac``, ``canary_ratio``,
``canary_in_band``, ``canary_verdict`` and ``precision/level``
([`precision_plugin._core.canary.ladder`][precision_plugin._core.canary.ladder]): level 2 is
certified once,
at the floor check, by rescoring and regenerating the canary at batch 1 and N.

verl and OpenRLHF workers call the same three pieces: build a ``CanaryMonitor`` once; at a due
step, after the weight sync, score the canary with the rollout worker's scorer and with the actor
(``Scorer.score``), and pass both to ``CanaryMonitor.check(step, learner, rollout)``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from precision_plugin._core.scoring import HFScorer, Scorer, TokenSequence
from precision_plugin.policy import PrecisionPolicy

log = logging.getLogger("precision_plugin")

#: Attribute holding a trainer's canary state.
ATTR = "_precision_plugin_canary"
#: Sequences kept from the first rollout batch.
CANARY_SEQUENCES = 16


class TRLCanary:
    """A GRPO trainer's canary: its sequences, monitor, schedule and the level evidence."""

    def __init__(self, policy: PrecisionPolicy) -> None:
        from precision_plugin._core.canary import CanaryMonitor

        self.policy = policy
        self.every = policy.metrics.canary_every
        self.sequences: list[TokenSequence] = []
        self.monitor = CanaryMonitor(strictness=policy.strictness)
        self.next_due = 1  # the floor: right after the first optimizer step
        self.invariance: Any = None
        self.one_dtype: bool | None = None
        self.off_reason: str | None = None
        self.seconds: list[float] = []  # wall time of each check's canary work
        self.certify_seconds: float | None = None  # the one-off level-2 certification
        self.last_batch_equal: float | None = None
        self._plain: Any = None

    @property
    def full(self) -> bool:
        """Whether the canary set is complete (no sequence is added after the floor)."""
        return len(self.sequences) >= CANARY_SEQUENCES or self.monitor.band is not None

    def remember(self, inputs: Any) -> None:
        """Add a rollout batch's sequences to the canary set until it holds
        ``CANARY_SEQUENCES`` (the first rollout batches of the run)."""
        if self.full:
            return
        prompt, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion, mask = inputs["completion_ids"], inputs["completion_mask"]
        for b in range(int(prompt.shape[0])):
            p = prompt[b][prompt_mask[b].bool()].tolist()
            c = completion[b][mask[b].bool()].tolist()
            if p and c and len(self.sequences) < CANARY_SEQUENCES:
                self.sequences.append(TokenSequence(tuple(p), tuple(c)))

    def due(self, step: int) -> bool:
        """Whether a check is due at optimizer step ``step`` (the floor waits for a full set)."""
        return self.every > 0 and self.full and bool(self.sequences) and step >= self.next_due

    def check(self, trainer: Any, batch_metrics: dict[str, float]) -> dict[str, float]:
        """Run one check now and return its metrics (names without the prefix)."""
        import time

        step = int(trainer.state.global_step)
        rollout = rollout_scorer(trainer, len(self.sequences))
        if rollout is None:
            return {}
        start = time.perf_counter()
        rollout_logps = rollout.score(self.sequences)
        learner = learner_scorer(trainer, self.policy, len(self.sequences))
        learner_logps = _scored_in_eval(learner, self.sequences)
        reference = None
        if learner.autocast != "float32":  # float32 masters: the precision reference
            if self._plain is None or self._plain.inner is not learner.model:
                self._plain = _class_forward(learner.model)
            fp32 = HFScorer(self._plain, batch_size=learner.batch_size)
            reference = _scored_in_eval(fp32, self.sequences)
        self.seconds.append(time.perf_counter() - start)
        floor = self.monitor.band is None
        result = self.monitor.check(
            step,
            learner_logps,
            rollout_logps,
            batch_k3=batch_metrics.get("k3_kl"),
            reference=reference,
        )
        self.next_due = (step // self.every + 1) * self.every
        if floor:
            start = time.perf_counter()
            self._certify(trainer, rollout)
            self.certify_seconds = time.perf_counter() - start
        batch_equal = batch_metrics.get("bitwise_equal_frac", self.last_batch_equal)
        self.last_batch_equal = batch_equal
        from precision_plugin._core.canary.ladder import precision_level

        level = precision_level(
            bool(self.one_dtype), self.invariance, result.bitwise_equal_frac, batch_equal
        )
        return {**result.metrics(), "level": float(level)}

    def _certify(self, trainer: Any, rollout: Scorer) -> None:
        """Level 1 from the audit, level 2's batch-invariance evidence (once, at the floor)."""
        from precision_plugin._core.canary.ladder import certify_batch_invariance
        from precision_plugin.audit import audit_run

        audit = audit_run(self.policy, trainer.args, trainer, trainer.model)
        self.one_dtype = not audit["contradictions"]
        engine = getattr(getattr(trainer, "rollout_func", None), "engine", None)
        generate = None
        if engine is not None and hasattr(engine, "generate"):
            generate = getattr(trainer.rollout_func, "generate_batch", None) or engine.generate
        size = max(2, len(self.sequences))
        self.invariance = certify_batch_invariance(
            rollout, self.sequences, size, generate=generate,
            max_new_tokens=max(len(s.completion_ids) for s in self.sequences),
        )  # fmt: skip
        log.info(
            "precision_plugin: level 2 check of the rollout engine (%s): %s",
            "certified" if self.invariance.certified else "not batch-invariant",
            self.invariance.summary(),
        )


def _class_forward(model: Any) -> Any:
    """The learner as its class defines it, for the float32 reference: Accelerate replaces the
    instance's ``forward`` with one that autocasts to the training dtype; this module's forward
    calls the class's ``forward``, which computes in the weights' own float32."""
    import torch

    class ClassForward(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        @property
        def config(self) -> Any:
            return self.inner.config

        def get_output_embeddings(self) -> Any:
            return self.inner.get_output_embeddings()

        def forward(self, **kwargs: Any) -> Any:
            return type(self.inner).forward(self.inner, **kwargs)

    return ClassForward(model)


def _scored_in_eval(scorer: HFScorer, sequences: Sequence[TokenSequence]) -> list[list[float]]:
    """Score with the model in eval mode (no dropout), its mode restored after."""
    model = scorer.model
    training = bool(getattr(model, "training", False))
    model.eval()
    try:
        return scorer.score(sequences)
    finally:
        model.train(training)


def learner_scorer(trainer: Any, policy: PrecisionPolicy, batch_size: int) -> HFScorer:
    """The learner at its current weights, in the dtype its training forward computes in: the
    policy dtype under autocast when its weights are float32 masters with fp16/bf16 on, the
    weights' own dtype otherwise."""
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    weights = next(model.parameters()).dtype
    args = trainer.args
    autocast = "float32"
    if weights == torch.float32 and (getattr(args, "fp16", False) or getattr(args, "bf16", False)):
        autocast = "float16" if args.fp16 else "bfloat16"
    return HFScorer(model, autocast=autocast, batch_size=batch_size)


def rollout_scorer(trainer: Any, batch_size: int) -> Scorer | None:
    """The rollout engine's scorer after its weight refresh, or ``None`` (said once) when this
    engine has no scoring path the canary can use."""
    rollout = getattr(trainer, "rollout_func", None)
    engine = getattr(rollout, "engine", None)
    if rollout is not None and hasattr(rollout, "_sync"):
        rollout._sync(trainer)  # what its next generation does first
        engine = rollout.engine
        size = getattr(rollout, "max_batch", None) or batch_size
        return HFScorer(engine.model, batch_size=size)
    generation = getattr(trainer, "vllm_generation", None)
    if getattr(trainer, "use_vllm", False) and generation is not None:
        if trainer.state.global_step != getattr(trainer, "_last_loaded_step", None):
            generation.sync_weights()  # TRL's own rule: once per step, then not again
            trainer._last_loaded_step = trainer.state.global_step
        llm = getattr(generation, "llm", None)
        if llm is not None:
            from precision_plugin._core.scoring.vllm import VLLMScorer

            return VLLMScorer(llm)
        client = getattr(generation, "vllm_client", None)
        if client is not None and hasattr(client, "get_sequence_logprobs"):
            return ClientScorer(client)
    _off_once(
        trainer,
        "the rollout engine has no scoring path the canary can use (HFRollout, colocated vLLM "
        "and a TRL whose VLLMClient has get_sequence_logprobs have one); no precision/canary_* "
        "metric in this run",
    )
    return None


def _off_once(trainer: Any, why: str) -> None:
    state = getattr(trainer, ATTR, None)
    if state is not None and state.off_reason is None:
        state.off_reason = why
        log.warning("precision_plugin: drift canary off: %s.", why)


class ClientScorer:
    """[`Scorer`][precision_plugin._core.scoring.Scorer] over TRL's ``VLLMClient`` (server mode):
    ``get_sequence_logprobs`` at temperature 1, the actual token's log-prob per position."""

    name = "vllm-server"

    def __init__(self, client: Any) -> None:
        self.client = client

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probs of each completion, from the server's ``prompt_logprobs``."""
        full = [list(s.prompt_ids) + list(s.completion_ids) for s in sequences]
        lengths = [len(s.prompt_ids) for s in sequences]
        out = self.client.get_sequence_logprobs(full, lengths, top_logprobs=1, temperature=1.0)
        return [[float(p[0]) for p in row] for row in out["actual_logprobs"]]


def state_of(trainer: Any, policy: PrecisionPolicy) -> TRLCanary | None:
    """The trainer's canary (created on first use), or ``None`` when ``canary_every`` is 0."""
    if trainer is None or policy.metrics.canary_every == 0:
        return None
    state = getattr(trainer, ATTR, None)
    if state is None:
        state = TRLCanary(policy)
        setattr(trainer, ATTR, state)
    return state


def collect(trainer: Any, policy: PrecisionPolicy, batch: dict[str, float]) -> dict[str, float]:
    """The canary's metrics at this log (empty when no check is due)."""
    state = getattr(trainer, ATTR, None) if trainer is not None else None
    if state is None or state.off_reason is not None:
        return {}
    if not state.due(int(trainer.state.global_step)):
        return {}
    return state.check(trainer, batch)
