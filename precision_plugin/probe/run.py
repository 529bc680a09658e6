"""The probe: measure the train/rollout mismatch of a model in each dtype, before any training.

For each dtype a rollout engine samples completions and returns the log-prob it assigned to
each sampled token (μ); then the same tokens are scored "the way a trainer does" (π): the HF
model with float32 master weights, one full-sequence forward under ``torch.autocast(dtype)``
(no autocast for float32). Both paths see the same tokens, position ids ``0..T-1`` counted
from each sequence's first real token, an attention mask that hides any padding, and
temperature 1, so in float32 they must agree to rounding noise: the float32 run is the probe's
self-check. If it fails, the two paths differ for a reason other than precision and every other
number is invalid. The built-in prompts are cut to one common length; a user's prompts
(``ProbeConfig.prompts``) keep their own lengths. The trainer side computes its log-probs a few
positions at a time, so no ``[T, vocab]`` tensor is built at any length.

Completion ``i`` of ``n`` is cut at ``ceil(max_new_tokens * (i + 1) / n)`` tokens (or ends at
EOS), so the sequence log-ratio can be fitted against length (the paper's Fig. 5).

Once every dtype is measured, ``advice.assess`` says what the mismatch does to RL at
``target_length`` (the consequence section, each dtype's verdict and the what-to-do line), and
with ``layerwise`` each low-precision dtype's longest sample is replayed through both sides
layer by layer (``layerwise.replay``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from precision_plugin._base.boundary import checked
from precision_plugin._base.progress import ProgressFn
from precision_plugin._core.hf_engine import (
    HFRolloutEngine,
    RolloutSample,
    hf_engine_factory,
    load_causal_lm,
)
from precision_plugin._core.scoring.hf import position_limit
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.advice import assess
from precision_plugin.probe.inputs import (
    build_prompts,
    check_model_dir,
    completion_budgets,
    encode_prompts,
    resolve_device,
)
from precision_plugin.probe.layerwise import LayerwiseReport, longest, replay
from precision_plugin.probe.overflow import OverflowCheck, check_overflow
from precision_plugin.probe.schema import (
    SELF_CHECK_DTYPE,
    DtypeResult,
    EngineFactory,
    ProbeConfig,
    ProbeResult,
)
from precision_plugin.probe.scoring import measure, self_check, trainer_logprobs

log = logging.getLogger("precision_plugin")


@checked
def available_engines() -> dict[str, EngineFactory]:
    """The built-in ``hf`` engine plus every engine the ``precision_probe_engines`` hooks return."""
    from precision_plugin._core.manager import call_each

    engines: dict[str, EngineFactory] = {"hf": hf_engine_factory}
    # One hook at a time: a broken plugin must not take the built-in engine down with it.
    for name, found in call_each("precision_probe_engines"):
        if isinstance(found, Exception):
            log.warning(
                "plugin %r failed to list its probe engines (%s: %s); its engines are skipped",
                name,
                type(found).__name__,
                found,
            )
            continue
        engines.update(found or {})
    return engines


@contextlib.contextmanager
def _model_dir(config: ProbeConfig) -> Iterator[tuple[str, str]]:
    """Yield ``(path, display name)``; the embedded model is saved to a temporary folder."""
    if config.model is not None:
        folder = check_model_dir(config.model)
        yield str(folder), str(config.model)
        return
    from precision_plugin.probe.tiny_model import DEFAULT_MODEL_NAME, save_default_model

    with tempfile.TemporaryDirectory(prefix="precision-probe-") as tmp:
        yield str(save_default_model(tmp)), DEFAULT_MODEL_NAME


#: Below this many parameters, CPU runs use one thread (see ``_single_thread_if_tiny``).
TINY_MODEL_PARAMS = 20_000_000


@contextlib.contextmanager
def _single_thread_if_tiny(model: Any, device: str) -> Iterator[None]:
    """Run a tiny model on one CPU thread, restoring torch's setting afterwards.

    Token-by-token decoding of a few-million-parameter model is latency-bound: thread hand-offs
    cost more than they save, and on a busy machine OpenMP spin-waits made a 2-thread run 20x
    slower than a 1-thread one.
    """
    import torch

    if device != "cpu" or sum(p.numel() for p in model.parameters()) >= TINY_MODEL_PARAMS:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _load_trainer(path: str, device: str) -> tuple[Any, Any]:
    try:
        return load_causal_lm(path, device)
    except Exception as exc:  # a bad config.json value fails anywhere inside transformers
        text = " ".join(str(exc).split())
        why = f"{type(exc).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"
        raise PrecisionConfigError(
            f"model: could not load {path!r} as an HF causal LM with its tokenizer ({why}); "
            f"pass a folder written by model.save_pretrained() and tokenizer.save_pretrained()."
        ) from None


def _measure_dtype(
    config: ProbeConfig,
    factory: EngineFactory,
    path: str,
    device: str,
    model: Any,
    prompts: list[list[int]],
    budgets: list[int],
    dtype: str,
    tick: Callable[[str, int], None],
) -> DtypeResult:
    """Rollout in ``dtype``, the trainer's forward, and the metrics, for one dtype."""
    n = len(prompts)
    t0 = time.perf_counter()
    tick(f"{dtype}: rollout ({config.engine})", 0)
    # Engines that size a context up front (vLLM) learn the longest sequence the run needs.
    context = max(len(p) for p in prompts) + config.max_new_tokens
    sizing = {"max_model_len": context} if _accepts(factory, "max_model_len") else {}
    engine = factory(path, dtype, device, config.seed, **sizing)
    try:
        extra = {"min_new_tokens": config.min_new_tokens} if config.min_new_tokens else {}
        if extra and not _accepts(engine.generate, "min_new_tokens"):
            raise PrecisionConfigError(
                f"min-new-tokens: the {config.engine!r} engine cannot suppress EOS (its "
                f"generate() takes no min_new_tokens); drop --min-new-tokens or use --engine hf."
            )
        if _accepts(engine.generate, "budgets"):
            extra["budgets"] = budgets  # no tokens past a row's budget (they would be cut)
        samples = engine.generate(prompts, config.max_new_tokens, config.seed, **extra)
    finally:
        engine.close()
    samples = [
        RolloutSample(s.prompt_ids, s.completion_ids[:b], s.logprobs[:b], s.meta)
        for s, b in zip(samples, budgets, strict=True)
    ]
    tick(f"{dtype}: trainer forward", n)
    train = []
    for sample in samples:
        train.extend(trainer_logprobs(model, [sample], dtype, device))
        tick(f"{dtype}: trainer forward", 1)
    rollout = [list(s.logprobs) for s in samples]
    metrics = measure(train, rollout)
    seconds = time.perf_counter() - t0
    # The verdict comes from the consequence section once every dtype is measured (assess).
    return DtypeResult(dtype, metrics, "measured", "", train, rollout, seconds, samples=samples)


def _layerwise(
    config: ProbeConfig,
    factory: EngineFactory,
    path: str,
    device: str,
    model: Any,
    results: dict[str, DtypeResult],
    tick: Callable[[str, int], None],
    notes: list[str],
) -> LayerwiseReport | None:
    """Replay each low-precision dtype's longest sample through both sides, layer by layer.

    The rollout side is the HF engine's own model (built by the run's factory, so a test's
    planted engine is what is replayed); an engine that runs elsewhere (vLLM) is stood in for
    by the HF engine, and a note says so.
    """
    if not config.layerwise:
        return None
    started = time.perf_counter()
    report = LayerwiseReport()
    for dtype, r in results.items():
        sample = longest(r.samples)
        if dtype == SELF_CHECK_DTYPE:
            continue
        if sample is None:  # not run (float16 beyond its range)
            tick(f"{dtype}: layerwise replay", 1)
            continue
        tick(f"{dtype}: layerwise replay", 0)
        # The HF engine's model can be hooked; another engine (vLLM) runs elsewhere, so the HF
        # engine stands in for it rather than loading that engine only to find no model.
        if config.engine == "hf":
            engine = factory(path, dtype, device, config.seed)
        else:
            engine = HFRolloutEngine.from_pretrained(path, dtype, device)
            note = (
                f"layerwise: the {config.engine} engine's model cannot be hooked from here; the "
                f"rollout side of the replay is the HF engine's {dtype} copy."
            )
            if note not in notes:
                notes.append(note)
        try:
            report.dtypes[dtype] = replay(
                model, engine.model, sample, dtype, device, margin_bits=config.overflow.margin_bits
            )
        finally:
            engine.close()
        tick(f"{dtype}: layerwise replay", 1)
    report.seconds = time.perf_counter() - started
    return report


def _overflowed(overflow: OverflowCheck, n: int, tick: Callable[[str, int], None]) -> DtypeResult:
    """float16 not run: the headroom shows activations beyond its range, so the rollout would
    sample from NaN (and an HF rollout stops with an error)."""
    worst = overflow.report.overflowing[0]
    reason = (
        f"not run: {worst.path or '<model>'!r} reaches {worst.max_abs:.3g} in float32, beyond "
        f"float16's 65504 (see headroom)"
    )
    tick("float16: skipped (overflow)", 2 * n)
    return DtypeResult("float16", measure([], []), "invalid", reason, [], [], 0.0)


def _accepts(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` takes the keyword argument ``name`` (or any keyword)."""
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@checked
def model_notes(overflow: OverflowCheck, config: ProbeConfig) -> list[str]:
    """Say where a float16 row stands in for what vLLM would refuse to run (gemma2 and the
    other families of ``check_model_config``'s refusal table, found by the headroom check)."""
    if "float16" not in config.dtypes or config.engine == "vllm":
        return []
    return [
        f"{risk.message} The float16 row is measured with the {config.engine} engine."
        for risk in overflow.risks
        if risk.status == "error"
    ]


def _float16_refusal(overflow: OverflowCheck) -> str | None:
    """Why vLLM will not run this checkpoint in float16 (its refusal table, found by the
    headroom check's ``model_type`` check), for the what-to-do line; ``None`` when it would."""
    for risk in overflow.risks:
        if risk.framework == "vllm" and risk.status == "error":
            return f"vLLM refuses float16 for model type {risk.details.get('model_type')!r}"
    return None


def _prompts(config: ProbeConfig, tokenizer: Any) -> list[list[int]]:
    if config.prompts is None:
        return build_prompts(tokenizer, config.num_prompts)
    return encode_prompts(tokenizer, config.prompts, config.num_prompts)


def _check_positions(model: Any, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Refuse prompts, or prompts with ``max_new_tokens`` more, longer than the model reads
    (its text config's ``max_position_embeddings``; nothing to check where it names none)."""
    limit = position_limit(model)
    if limit is None:
        return
    longest = max(len(p) for p in prompts)
    if longest >= limit:
        which = 1 + next(i for i, p in enumerate(prompts) if len(p) == longest)
        raise PrecisionConfigError(
            f"prompts: prompt {which} is {longest} tokens long, and the model reads at most "
            f"max_position_embeddings={limit} tokens, prompt and completion together; "
            f"shorten it to fewer than {limit} tokens (the probe uses prompts as written)."
        )
    if longest + max_new_tokens > limit:
        raise PrecisionConfigError(
            f"max-new-tokens: {max_new_tokens} plus the longest prompt's {longest} "
            f"tokens exceeds the model's max_position_embeddings={limit}; pass "
            f"--max-new-tokens {max(1, limit - longest)} or less, or shorter prompts."
        )


def preflight_engine(
    engine: str, device: str, engines: dict[str, EngineFactory] | None = None
) -> tuple[EngineFactory, str]:
    """The factory of ``engine`` and the resolved ``device``, after the engine's own check
    (``preflight(device)``: no vLLM, a device it cannot run on): the CLI calls it as soon as
    the arguments are parsed, the probe before the model loads. Raises
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError]."""
    engines = available_engines() if engines is None else engines
    if engine not in engines:
        raise PrecisionConfigError(
            f"engine: {engine!r} is not available; available: {', '.join(sorted(engines))}"
            f". Other engines come from plugins (vllm: install the vllm package)."
        )
    factory = engines[engine]
    resolved = resolve_device(device)
    preflight = getattr(factory, "preflight", None)
    if callable(preflight):
        preflight(resolved)
    return factory, resolved


@checked
def run_probe(
    config: ProbeConfig | None = None,
    *,
    engines: dict[str, EngineFactory] | None = None,
    progress: ProgressFn | None = None,
) -> ProbeResult:
    """Run the probe and return its [`ProbeResult`][precision_plugin.probe.ProbeResult] (see the
    module docstring).

    ``engines`` overrides ``available_engines`` (tests pass their own factories). Raises
    [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] for bad input.
    """
    config = config or ProbeConfig()
    started = time.perf_counter()
    engines = available_engines() if engines is None else engines
    factory, device = preflight_engine(config.engine, config.device, engines)
    n = config.num_prompts
    total = 2 * n * len(config.dtypes) + (len(config.dtypes) - 1) * config.layerwise
    total += len(config.dtypes) * (config.attribution is not None)
    done = 0

    def tick(description: str, advance: int) -> None:
        nonlocal done
        done += advance
        if progress is not None:
            progress(description, done, total)

    with _model_dir(config) as (path, name):
        tick("loading the trainer model", 0)
        model, tokenizer = _load_trainer(path, device)
        prompts = _prompts(config, tokenizer)
        _check_positions(model, prompts, config.max_new_tokens)
        budgets = completion_budgets(n, config.max_new_tokens)
        results: dict[str, DtypeResult] = {}
        with _single_thread_if_tiny(model, device):
            tick("float16 headroom", 0)
            overflow = check_overflow(model, prompts, path, config.overflow.margin_bits)
            notes = model_notes(overflow, config)
            for note in notes:
                log.warning("probe: %s", note)
            for dtype in config.dtypes:
                if dtype == "float16" and overflow.report.overflowing:
                    results[dtype] = _overflowed(overflow, n, tick)
                    continue
                results[dtype] = _measure_dtype(
                    config, factory, path, device, model, prompts, budgets, dtype, tick
                )
            layerwise = _layerwise(config, factory, path, device, model, results, tick, notes)
            attribution = None
            if config.attribution is not None:
                from precision_plugin.probe.attribution.probe import attribute_probe

                attribution = attribute_probe(config, model, prompts, budgets, results, tick)
        del model

    check = self_check(results[SELF_CHECK_DTYPE].metrics, config.metrics)
    fp32 = results[SELF_CHECK_DTYPE]
    fp32.verdict, fp32.reason = ("ok" if check.passed else "invalid"), check.message
    if not check.passed:
        log.error("%s", check.message)
        for r in results.values():
            if r.dtype != SELF_CHECK_DTYPE:
                r.verdict, r.reason = "invalid", "float32 self-check failed"
    configured, configured_settings = configured_rollout(attribution)
    consequence = assess(
        results,
        config.target_length,
        valid=check.passed,
        float16_refused=_float16_refusal(overflow),
        batch_size=config.batch_size,
        overflow=overflow,
        attribution=attribution.evidence() if attribution is not None else None,
        configured=configured,
        configured_settings=configured_settings,
        deepspeed_runs=deepspeed_runs(),
    )
    for r in results.values():
        if r.dtype != SELF_CHECK_DTYPE and r.verdict != "invalid":
            c = consequence.dtypes[r.dtype]
            r.verdict, r.reason = c.verdict, c.line
    for r in configured.values():
        c = consequence.configured[r.dtype]
        r.verdict, r.reason = c.verdict, c.line
    return ProbeResult(
        model=name,
        engine=config.engine,
        device=device,
        config=config,
        results=results,
        self_check=check,
        seconds=time.perf_counter() - started,
        overflow=overflow,
        notes=notes,
        consequence=consequence,
        layerwise=layerwise,
        attribution=attribution,
        peak_rss_mb=peak_rss_mb(),
        configured=configured,
        configured_settings=configured_settings,
    )


def configured_rollout(attribution: Any) -> tuple[dict[str, DtypeResult], str]:
    """The rollout as configured (``--rollout`` settings that differ from the defaults), per
    dtype, from the attribution's own measurement of it (its samples, the rollout's log-probs
    under the settings and the trainer's): ``({dtype: DtypeResult}, "key=value, ...")``; empty
    without an attribution or with the default rollout (the probe's own rows are that one)."""
    from precision_plugin.probe.attribution.settings import changed_settings

    if attribution is None:
        return {}, ""
    changed = changed_settings(attribution.settings.to_dict())
    if not changed:
        return {}, ""
    words = ", ".join(f"{key}={value}" for key, value in changed.items())
    out = {}
    for dtype, block in attribution.dtypes.items():
        pi, mu = block.trainer_logprobs, block.rollout_logprobs
        if pi:
            out[dtype] = DtypeResult(dtype, measure(pi, mu), "measured", "", pi, mu, block.seconds)
    return out, words


def deepspeed_runs() -> dict[str, bool]:
    """The dtypes DeepSpeed's accelerator runs on this machine, as ``doctor`` tells them (empty
    without DeepSpeed installed, or where it cannot be told)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return {}
    from precision_plugin.deepspeed.device import deepspeed_support

    support = deepspeed_support()
    return {
        dtype: ok
        for dtype, ok in (("float16", support.fp16), ("bfloat16", support.bf16))
        if ok is not None
    }


def peak_rss_mb() -> float | None:
    """This process's peak resident set size so far, in MiB (``None`` without ``resource``)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)
