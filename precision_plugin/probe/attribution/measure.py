"""``probe --attribute``: on the same tokens, what each cause adds to the mismatch.

Per dtype, the rollout samples once with everything the user's rollout runs with (the
``--rollout`` settings applied as the engine applies them; decoding with the KV cache, all
prompts in one padded batch) and records its log-probs ``mu``. The trainer scores the same
tokens (``pi``: float32 master weights under autocast, one prefill pass per sequence, the logits
divided by the temperature as TRL does). Then each cause is switched on alone against a common
base, the rollout's own weights scored like the trainer (prefill, alone, the trainer's
convention), and every token's log-prob difference is recorded:

- ``dtype``: base against the trainer (both sides in the dtype; in float32 they agree);
- ``batch``: inside the padded batch of all sequences against alone (bit for bit, the core's
  [`batch_rescore`][precision_plugin._core.scoring.batch_rescore]);
- ``decode``: KV-cache incremental decode of the whole batch against the batch's prefill (the
  two chain: decode-in-the-batch against prefill alone is their sum);
- ``sampling``: the rollout's log-prob convention against the trainer's;
- ``lm_head``, ``rope``, ``kv_cache``, ``router``: that component as the rollout runs it;
- ``stale_weights``: the base one Adam step behind (always a what-if: a scale, not a cause);
  [`attribute`][precision_plugin.probe.attribution.measure.attribute] takes that step once per
  run, on the first dtype's samples, and every dtype reads the same step (in RL, the step the
  rollout lags behind was computed on an earlier batch, not on the tokens being scored).

Causes the rollout does not run with are measured as what-ifs (an fp8 e4m3 KV cache, an fp32 LM
head, RoPE rounded to the dtype, an fp32 router) and have no share.

The shares: the ``k`` causes in the total are then switched on together, every subset ``S`` of
them on the same tokens (``subset_scores``): the rollout's dtype weights when ``dtype`` is in
``S``, else the trainer's (float32 master weights under autocast, with an fp32 LM head or
router computed outside autocast); KV-cache decode when ``decode`` is, one padded batch of all
sequences when ``batch`` is, the engine's log-prob convention when ``sampling`` is, and each
component switch in ``S`` as the rollout sets it. ``v(S)`` is the trainer against that rollout's
k3, and each cause's part of the total is its Shapley value (``decompose.cause_shares``). The
passes above already give ``k + 1`` of the ``2^k`` subsets (the empty one is the trainer, the
dtype row's base, and the base with batch, decode in the batch, sampling or one component), so
the shares take ``2^k - k - 1`` more passes; above ``SHAPLEY_MAX_CAUSES`` causes the parts are
the sequential saving in ``CAUSES`` order (no pass beyond the ``k`` prefixes). The arithmetic is
in [`decompose`][precision_plugin.probe.attribution.decompose].
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from precision_plugin._core.rollout import RolloutSample
from precision_plugin._core.sampling import LogitsProcessor
from precision_plugin._core.scoring import HFScorer, TokenSequence, batch_rescore, bitwise_equal
from precision_plugin._core.scoring.interface import sequences_of
from precision_plugin._core.scoring.packed_cpu import trainer_kernels
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.attribution.decompose import (
    cause_shares,
    k3_interval,
    log_ratio,
    share_method,
    subsets_needed,
)
from precision_plugin.probe.attribution.fixes import CAUSES, first_change
from precision_plugin.probe.attribution.report import (
    AttributionReport,
    CauseRow,
    DtypeAttribution,
    truncation_note,
)
from precision_plugin.probe.attribution.settings import DEFAULT_LEARNING_RATE, RolloutSettings
from precision_plugin.probe.attribution.variants import (
    apply_switches,
    has_rope,
    outside_autocast,
    recorded_routes,
    routers,
    stepped_weights,
)

log = logging.getLogger("precision_plugin")


def trainer_transform(settings: RolloutSettings) -> Callable[[Any, Any], Any]:
    """The trainer's convention (TRL's): ``log_softmax(logits / temperature)``, full vocabulary."""
    temperature = settings.temperature

    def transform(logits: Any, positions: Any) -> Any:
        del positions
        return (logits / temperature if temperature != 1.0 else logits).log_softmax(-1)

    return transform


def engine_transform(
    settings: RolloutSettings, vocab: int, eos: Sequence[int], min_new_tokens: int, device: str
) -> Callable[[Any, Any], Any]:
    """The rollout engine's convention (vLLM's): ``raw_logprobs`` is ``log_softmax(logits)``
    before temperature; ``processed_logprobs`` that of the processed logits (EOS masked before
    ``min_new_tokens``, temperature, top-k, top-p), the distribution sampled from."""
    import torch

    if settings.logprobs_mode == "raw_logprobs":
        return lambda logits, positions: logits.log_softmax(-1)
    processor = LogitsProcessor(settings.sampling(), [], vocab, device)
    stop = torch.tensor(sorted(eos), dtype=torch.long, device=device)

    def transform(logits: Any, positions: Any) -> Any:
        out = processor.process(logits)
        early = positions < min_new_tokens
        if min_new_tokens and bool(early.any()) and stop.numel():
            out[early] = processor.process(logits[early], stop)
        return out.log_softmax(-1)

    return transform


def _eos_ids(model: Any) -> list[int]:
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(ids)


def present_switches(settings: RolloutSettings, compute: str) -> dict[str, Any]:
    """The component switches the rollout runs with (``apply_switches`` keywords)."""
    del compute
    return {
        "rope_dtype": settings.rope_dtype,
        "head_dtype": settings.head_dtype,
        "kv_format": settings.kv_format,
        "router_dtype": settings.router_dtype,
    }


def rollout_samples(
    master: Any,
    prompts: list[list[int]],
    budgets: list[int],
    dtype: str,
    settings: RolloutSettings,
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    seed: int,
) -> list[RolloutSample]:
    """Sample with the HF engine running ``settings`` (all prompts in one batch, KV cache);
    prompt ``i`` stops at ``budgets[i]`` tokens and leaves the batch, as in the probe's own
    rollout, rather than decoding to ``max_new_tokens`` and being cut afterwards."""
    from precision_plugin._core.hf_engine import HFRolloutEngine

    device = str(next(master.parameters()).device)
    engine = HFRolloutEngine(master, dtype, device)
    apply_switches(engine.model, master, dtype, **present_switches(settings, dtype))
    try:
        samples = engine.generate(
            prompts,
            max_new_tokens,
            seed,
            sampling=settings.sampling(),
            min_new_tokens=min_new_tokens,
            budgets=list(budgets),
        )
    finally:
        engine.close()
    return samples


def _flip_share(base: list[Any], other: list[Any]) -> float:
    """Share of routed positions (per router call: one layer, ``[positions, top_k]`` sorted)
    whose chosen experts differ."""
    if not base or len(base) != len(other):
        return math.nan
    flips = sum(int((a != b).any(-1).sum()) for a, b in zip(base, other, strict=True))
    total = sum(a.shape[0] for a in base)
    return flips / total if total else math.nan


def attribute_dtype(
    master: Any,
    samples: Sequence[RolloutSample],
    dtype: str,
    settings: RolloutSettings,
    *,
    min_new_tokens: int = 0,
    learning_rate: float | None = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    what_if: bool = True,
    recorded_decode: bool = False,
    stale: dict[str, Any] | None = None,
    trainer: Sequence[Sequence[float]] | None = None,
    phase: Callable[[str], None] | None = None,
) -> DtypeAttribution:
    """Attribute ``samples``' mismatch (rollout ``dtype`` with ``settings``) to its causes.

    ``what_if=False`` measures only the causes this rollout runs with; ``learning_rate=None``
    leaves out the stale-weights row. ``recorded_decode=True`` says the samples' log-probs were
    recorded by the HF engine decoding all of them in one batch, in ``dtype``, with the default
    rollout settings (the probe's own samples): they are then the decode side itself, and the
    ``decode`` row uses them instead of decoding the same tokens a second time
    (``tests/unit/test_attribution.py`` pins that the second decode gives them bit for bit).
    ``stale``: the stepped weights the ``stale_weights`` row reads (``stepped_weights``' state
    dict); ``None`` takes that step here, on ``samples``. ``trainer``: the trainer's log-probs
    of ``samples`` already computed the way ``pi`` is (the probe's own trainer forward with the
    default rollout settings: the same scorer, bit for bit); ``None`` scores them here.
    ``phase``: called with ``"<dtype>: attribution: <cause>"`` before each cause's pass (the
    probe's progress line).
    """
    started = time.perf_counter()
    announce = phase if phase is not None else (lambda what: None)
    seqs = sequences_of(samples)
    mu = [list(s.logprobs) for s in samples]
    vocab = int(master.get_output_embeddings().out_features)
    device = str(next(master.parameters()).device)
    train_t = trainer_transform(settings)
    engine_t = engine_transform(settings, vocab, _eos_ids(master), min_new_tokens, device)

    if trainer is not None:
        pi = [list(row) for row in trainer]
        lengths = [len(s.completion_ids) for s in samples]
        if [len(row) for row in pi] != lengths:
            raise PrecisionConfigError(
                f"attribute_dtype(trainer=...): expected one list of log-probs per sample, as "
                f"long as its completion ({len(lengths)} samples of {lengths[:4]}"
                f"{'...' if len(lengths) > 4 else ''} tokens), got {len(pi)} of "
                f"{[len(row) for row in pi][:4]}{'...' if len(pi) > 4 else ''}; pass the "
                f"trainer log-probs of these same samples, or trainer=None to score them here."
            )
    else:
        announce(f"{dtype}: attribution: trainer side")
        pi = HFScorer(master, autocast=dtype, transform=train_t).score(seqs)
    announce(f"{dtype}: attribution: dtype")
    base_model = apply_switches(_copy(master, dtype), master, dtype)
    base_scorer = HFScorer(base_model, transform=train_t)
    moe = bool(routers(master))
    # Every prefill pass on a rollout copy is scored "like the trainer": with the trainer's
    # kernels, so a row differs from the trainer only by what it switches (the decode pass
    # keeps the engine's kernels: that difference is part of decoding against prefill).
    with trainer_kernels(), recorded_routes(base_model) as base_routes:
        base = base_scorer.score(seqs)

    measured: list[tuple[str, list[list[float]], bool, str, float | None, float, int]] = []
    # The rollout log-probs of each subset of causes switched on together already scored.
    known: dict[frozenset[str], list[list[float]]] = {frozenset(): pi, frozenset({"dtype"}): base}

    def add(cause: str, side: list[list[float]], reference: list[list[float]], in_total: bool,
            what: str = "", flips: float | None = None) -> None:  # fmt: skip
        equal = bitwise_equal(side, reference)
        d = log_ratio(side, reference)
        measured.append((cause, d, in_total, what, flips, equal.fraction, equal.total))

    def variant(cause: str, **switch: Any) -> tuple[list[list[float]], float | None]:
        announce(f"{dtype}: attribution: {cause}")
        model = apply_switches(_copy(master, dtype), master, dtype, **switch)
        scorer = HFScorer(model, transform=train_t)  # checks its LM head outside the record
        with trainer_kernels(), recorded_routes(model) as seen:
            scores = scorer.score(seqs)
        return scores, (_flip_share(base_routes, seen) if moe else None)

    add("dtype", base, pi, True)
    # decode is switched inside the rollout's own padded batch (one decode pass for all
    # sequences, as the engine decodes), against that batch's prefill; batch against alone.
    # The two chain: their sum is decode-in-the-batch against prefill alone.
    n = len(seqs)
    prefill_n = base
    if n > 1:
        announce(f"{dtype}: attribution: batch")
        batched = HFScorer(base_model, batch_size=n, transform=train_t)
        with trainer_kernels():
            rescore = batch_rescore(batched, seqs, n, seed=seed, alone=base)
        add("batch", rescore.batched, base, True)
        prefill_n = rescore.batched
        known[frozenset({"dtype", "batch"})] = rescore.batched
    if recorded_decode and settings == RolloutSettings():
        decoded = mu
    else:
        announce(f"{dtype}: attribution: decode")
        decoded = HFScorer(base_model, incremental=True, batch_size=n, transform=train_t).score(
            seqs
        )
    add("decode", decoded, prefill_n, True)
    known[frozenset({"dtype", "decode", "batch"} if n > 1 else {"dtype", "decode"})] = decoded
    if settings.samples_differently or settings.logprobs_mode == "processed_logprobs":
        announce(f"{dtype}: attribution: sampling")
        with trainer_kernels():
            processed = HFScorer(base_model, transform=engine_t).score(seqs)
        add("sampling", processed, base, True)
        known[frozenset({"dtype", "sampling"})] = processed
    truncation: tuple[float, int] | None = None
    if settings.truncates and settings.logprobs_mode == "raw_logprobs":
        announce(f"{dtype}: attribution: sampling (mass kept)")
        truncation = _mass_kept(base, base_model, seqs, settings, vocab, device)
    low = dtype != "float32"
    switched = present_switches(settings, dtype)
    plan = (
        ("lm_head", "head_dtype", "float32" if low else None, "the LM head in float32"),
        ("rope", "rope_dtype", dtype if low else None, f"RoPE inv_freq rounded to {dtype}"),
        ("kv_cache", "kv_format", "float8_e4m3fn", "an fp8 e4m3 KV cache"),
        ("router", "router_dtype", "float32" if low else None, "the router in float32"),
    )
    for cause, key, hypothetical, what in plan:
        if (cause == "router" and not moe) or (cause == "rope" and not has_rope(master)):
            continue  # nothing to switch: a dense model, learned or ALiBi positions
        if switched[key] is not None:
            scores, flips = variant(cause, **{key: switched[key]})
            add(cause, scores, base, True, flips=flips)
            known[frozenset({"dtype", cause})] = scores
        elif what_if and hypothetical is not None:
            scores, flips = variant(cause, **{key: hypothetical})
            add(cause, scores, base, False, what, flips)
    if learning_rate is not None:
        announce(f"{dtype}: attribution: stale_weights")
        weights = stale if stale is not None else stepped_weights(master, seqs, learning_rate, seed)
        with trainer_kernels():
            stale = HFScorer(apply_switches(_copy(master, dtype, weights), master, dtype),
                             transform=train_t).score(seqs)  # fmt: skip
        add("stale_weights", stale, base, False,
            f"weights one Adam step behind (lr {learning_rate:g})")  # fmt: skip

    players = [c for c in CAUSES if any(m[0] == c and m[2] for m in measured)]
    method = share_method(len(players))
    masks = subsets_needed(len(players), method)
    # In float32 the dtype switches nothing (subset_scores): a subset with it and without it
    # are one pass.
    same = (lambda m: m | {"dtype"}) if dtype == "float32" and "dtype" in players else (lambda m: m)
    for members in list(known):
        known.setdefault(same(members), known[members])
    missing = {same(_members(players, m)) for m in masks} - set(known)
    if missing:
        announce(f"{dtype}: attribution: causes together ({len(missing)} passes)")
    together: dict[int, list[list[float]]] = {}
    for mask in masks:
        members = same(_members(players, mask))
        if members not in known:
            known[members] = subset_scores(
                master, seqs, dtype, members, switched,
                train_t=train_t, engine_t=engine_t, seed=seed,
            )  # fmt: skip
        together[mask] = log_ratio(known[members], pi)

    total = log_ratio(mu, pi)
    # A token one side gives probability 0 (outside a top-p/top-k nucleus) has an infinite
    # log-ratio: it is counted and left out of every row, so all rows cover the same tokens.
    keep = []
    for i, t in enumerate(total):
        columns = zip(
            t, *(m[1][i] for m in measured), *(d[i] for d in together.values()), strict=True
        )
        keep.append([all(math.isfinite(x) for x in xs) for xs in columns])

    def kept(rows_: list[list[float]]) -> list[list[float]]:
        return [
            [x for x, k in zip(r, ks, strict=True) if k] for r, ks in zip(rows_, keep, strict=True)
        ]

    total = kept(total)
    shares = cause_shares(
        total, {mask: kept(d) for mask, d in together.items()}, players, method=method
    )
    rows: list[CauseRow] = []
    for cause, d, in_total, what, flips, fraction, count in measured:
        k3 = k3_interval(kept(d))
        split = shares.parts.get(cause) if in_total else None
        part = split.value if split is not None else k3.value
        share = split.share if split is not None else None
        row = CauseRow(
            cause, in_total, k3, part, _finite(share), fraction, count, what, flips, split=split
        )
        if cause == "sampling" and truncation is not None:
            row.truncation, row.truncation_tokens = truncation
        rows.append(row)
    order = {c: i for i, c in enumerate(CAUSES)}
    rows.sort(key=lambda r: order[r.cause])
    equal = bitwise_equal(mu, pi)
    return DtypeAttribution(
        dtype=dtype,
        total=shares.total,
        total_part=shares.total.value,
        bitwise_equal=equal.fraction,
        tokens=equal.total,
        excluded=sum(not k for ks in keep for k in ks),
        rows=rows,
        interaction=math.nan,
        residual=shares.residual.value,
        shares=shares,
        conventions=conventions(settings),
        seconds=time.perf_counter() - started,
        trainer_logprobs=[list(map(float, row)) for row in pi],
        rollout_logprobs=[list(map(float, row)) for row in mu],
    )


def _mass_kept(
    base: list[list[float]],
    model: Any,
    seqs: Any,
    settings: RolloutSettings,
    vocab: int,
    device: str,
) -> tuple[float, int]:
    """The mean over the sampled tokens of ``log M``, ``M`` the mass of the distribution
    sampled from (``log_softmax(logits / temperature)``, ``base``'s convention) that the top-k /
    top-p truncation keeps at that step: ``base`` minus the truncated, renormalised log-prob of
    the same token (``processed_logprobs``' convention, the EOS mask of ``min_new_tokens`` left
    out), with the number of tokens behind it (a token outside this pass's nucleus has no
    finite one and is left out)."""
    import dataclasses

    nucleus = dataclasses.replace(settings, logprobs_mode="processed_logprobs")
    transform = engine_transform(nucleus, vocab, [], 0, device)
    with trainer_kernels():
        kept = HFScorer(model, transform=transform).score(seqs)
    logs = [
        b - k
        for rb, rk in zip(base, kept, strict=True)
        for b, k in zip(rb, rk, strict=True)
        if math.isfinite(b - k)
    ]
    return (math.fsum(logs) / len(logs) if logs else math.nan), len(logs)


def conventions(settings: RolloutSettings) -> dict[str, str]:
    """Which log-prob each side records (the ``sampling`` cause compares them)."""
    t = settings.temperature
    if settings.logprobs_mode == "raw_logprobs":
        rollout = "vLLM raw_logprobs: log_softmax(logits), before temperature/top-k/top-p"
    else:
        rollout = (
            f"vLLM processed_logprobs: log_softmax after temperature {t:g}, top_k "
            f"{settings.top_k}, top_p {settings.top_p:g} (renormalised)"
        )
    trainer = f"TRL: log_softmax(logits / {t:g}) over the full vocabulary"
    return {"rollout": rollout, "trainer": trainer}


def _copy(master: Any, dtype: str, weights: dict[str, Any] | None = None) -> Any:
    from precision_plugin._core.buffers import cast_model
    from precision_plugin._core.scoring.float16_cpu import widen_float16
    from precision_plugin._core.scoring.packed_cpu import pack_linears

    model = copy.deepcopy(master)
    if weights is not None:
        model.load_state_dict(weights)
    model = cast_model(model, dtype).eval()
    widen_float16(model)
    pack_linears(model)
    return model


def _half_mean_sq(d: list[list[float]]) -> float:
    """``E[d^2]/2`` over the tokens (the old split's part of a cause)."""
    flat = [x for row in d for x in row]
    return math.fsum(x * x for x in flat) / (2 * len(flat)) if flat else math.nan


def _finite(share: float | None) -> float | None:
    """A share, or ``None`` where there is none (a total of 0 has nothing to split)."""
    return share if share is not None and math.isfinite(share) else None


def _members(players: Sequence[str], mask: int) -> frozenset[str]:
    return frozenset(c for i, c in enumerate(players) if mask >> i & 1)


#: The component causes and the ``apply_switches`` keyword that switches each on.
_COMPONENT = {
    "lm_head": "head_dtype",
    "rope": "rope_dtype",
    "kv_cache": "kv_format",
    "router": "router_dtype",
}


def subset_scores(
    master: Any,
    seqs: Sequence[TokenSequence],
    dtype: str,
    causes: frozenset[str],
    switched: dict[str, Any],
    *,
    train_t: Callable[[Any, Any], Any],
    engine_t: Callable[[Any, Any], Any],
    seed: int = 0,
) -> list[list[float]]:
    """The rollout's log-probs of ``seqs`` with ``causes`` switched on together and every other
    cause off (module docstring): ``dtype`` the rollout's dtype weights (else the trainer's
    float32 master weights under autocast), ``decode`` KV-cache decode, ``batch`` all sequences
    in one padded batch (a prefill in ``batch_rescore``'s seeded order), ``sampling`` the
    engine's log-prob convention, a component cause its ``switched`` setting (in float32 the
    dtype switches nothing: every subset runs on the rollout copy). Prefill passes run the
    trainer's kernels, decode passes the engine's, as the rows do."""
    switch = {key: switched[key] for cause, key in _COMPONENT.items() if cause in causes}
    # In float32 the dtype switches nothing (the rollout copy holds the trainer's weights and
    # prefills with its kernels), so every subset runs on the rollout copy: decoding then keeps
    # the engine's kernels with or without it, and the dtype's part is exactly 0.
    if "dtype" in causes or dtype == "float32":
        model, autocast = apply_switches(_copy(master, dtype), master, dtype, **switch), "float32"
    else:
        model = apply_switches(copy.deepcopy(master).eval(), master, dtype, **switch)
        autocast = dtype
        if "lm_head" in causes:
            outside_autocast(model.get_output_embeddings())
        if "router" in causes:
            for _, router in routers(model):
                outside_autocast(router)
    n = len(seqs) if "batch" in causes else 1
    transform = engine_t if "sampling" in causes else train_t
    if "decode" in causes:
        scorer = HFScorer(model, autocast=autocast, incremental=True, batch_size=n,
                          transform=transform)  # fmt: skip
        return scorer.score(seqs)
    scorer = HFScorer(model, autocast=autocast, batch_size=n, transform=transform)
    with trainer_kernels():
        if n == 1:
            return scorer.score(seqs)
        order = list(range(len(seqs)))
        random.Random(seed).shuffle(order)
        got = scorer.score([seqs[i] for i in order])
    out: list[list[float]] = [[] for _ in seqs]
    for i, row in zip(order, got, strict=True):
        out[i] = list(row)
    return out


def attribute(
    master: Any,
    samples_by_dtype: dict[str, Sequence[RolloutSample]],
    settings: RolloutSettings,
    *,
    min_new_tokens: int = 0,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    tick: Callable[[str], None] | None = None,
    recorded_decode: bool = False,
    trainer: dict[str, Sequence[Sequence[float]]] | None = None,
    phase: Callable[[str], None] | None = None,
) -> AttributionReport:
    """[`attribute_dtype`][precision_plugin.probe.attribution.measure.attribute_dtype] for each
    dtype (``recorded_decode`` and ``trainer``, per dtype, as there), and the first setting to
    change. The stale-weights step is taken once, on the first dtype's samples, and shared by
    every dtype. ``tick`` is called once per dtype, ``phase`` before each pass within one."""
    started = time.perf_counter()
    report = AttributionReport(settings, learning_rate)
    announce = phase if phase is not None else (lambda what: None)
    stale = None
    for dtype, samples in samples_by_dtype.items():
        if stale is None:
            announce(f"attribution: one Adam step for stale_weights (lr {learning_rate:g})")
            stale = stepped_weights(master, sequences_of(samples), learning_rate, seed)
            if _unchanged(master, stale):
                report.notes.append(
                    f"stale_weights: one Adam step at lr {learning_rate:g} changed no weight "
                    f"(each move is below the weight's float32 rounding), so the row is 0; pass "
                    f"the --learning-rate you train at."
                )
        if tick is not None:
            tick(f"{dtype}: attribution")
        report.dtypes[dtype] = block = attribute_dtype(
            master, samples, dtype, settings,
            min_new_tokens=min_new_tokens, learning_rate=learning_rate, seed=seed,
            recorded_decode=recorded_decode, stale=stale,
            trainer=None if trainer is None else trainer.get(dtype), phase=phase,
        )  # fmt: skip
        sampling = block.row("sampling")
        if sampling is not None and sampling.truncation is not None:
            note = truncation_note(sampling.truncation, sampling.truncation_tokens)
            report.notes.append(f"sampling ({dtype}): {note}")
    report.first = first_change(report.first_rows())
    report.seconds = time.perf_counter() - started
    return report


def _unchanged(master: Any, stepped: dict[str, Any]) -> bool:
    """Whether the stepped state dict equals ``master``'s, every tensor bit for bit."""
    import torch

    own = master.state_dict()
    return all(torch.equal(own[k], v) for k, v in stepped.items() if k in own)


__all__ = [
    "DEFAULT_LEARNING_RATE",
    "TokenSequence",
    "attribute",
    "attribute_dtype",
    "conventions",
    "engine_transform",
    "subset_scores",
    "rollout_samples",
    "trainer_transform",
]
