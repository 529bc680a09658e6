"""The probe: measure the train/rollout mismatch of a model in each dtype, before any training.

For each dtype a rollout engine samples completions and returns the log-prob it assigned to
each sampled token (μ); then the same tokens are scored "the way a trainer does" (π): the HF
model with float32 master weights, one full-sequence forward under ``torch.autocast(dtype)``
(no autocast for float32). Both paths see the same prompts, no padding, an all-ones attention
mask, position ids ``0..T-1`` and temperature 1, so in float32 they must agree to rounding
noise: the float32 run is the probe's self-check. If it fails, the two paths differ for a
reason other than precision and every other number is invalid.

Completion ``i`` of ``n`` is cut at ``ceil(max_new_tokens * (i + 1) / n)`` tokens (or ends at
EOS), so the sequence log-ratio can be fitted against length (the paper's Fig. 5).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.mismatch import MismatchMetrics, compute_mismatch, verdict
from precision_plugin.policy import MetricSettings, normalize_dtype
from precision_plugin.rollout import (
    RolloutEngine,
    RolloutSample,
    hf_engine_factory,
    load_causal_lm,
)

log = logging.getLogger("precision_plugin")

DEFAULT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
DEFAULT_NUM_PROMPTS = 16
DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_SEED = 0
#: Prompts longer than this (in tokens) are cut; all prompts are cut to one common length.
MAX_PROMPT_TOKENS = 48
#: The dtype whose run is the self-check (always run, first).
SELF_CHECK_DTYPE = "float32"

EngineFactory = Callable[[str, str, str, int], RolloutEngine]
#: ``progress(description, completed, total)``, called as the probe advances.
ProgressFn = Callable[[str, int, int], None]

PROMPTS: tuple[str, ...] = (
    "The history of the printing press begins in the fifteenth century, when",
    "To compute the derivative of a product of two functions, we first",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "The main difference between a list and a tuple in Python is that",
    "Photosynthesis converts light energy into chemical energy. In the first stage,",
    "Question: A train travels 120 km in 1.5 hours. What is its average speed? Answer:",
    "Dear hiring committee, I am writing to apply for the position of",
    "The recipe calls for two cups of flour, one egg and a pinch of salt. First,",
    "In reinforcement learning, the policy gradient theorem states that",
    "Here is a short poem about the sea at night, written in free verse:",
    "The three laws of motion formulated by Isaac Newton describe",
    "def fibonacci(n):\n    # return the n-th Fibonacci number\n    if n < 2:",
    "Solve for x: 3x + 7 = 22. First subtract seven from both sides, which gives",
    "The city council met on Tuesday to discuss the new budget, which",
    "A good unit test should be fast, isolated and repeatable, because",
    "Translate to French: 'The weather is beautiful today.' Translation:",
)


@dataclass(frozen=True)
class ProbeConfig:
    """What to probe: model, engine, dtypes, and how many tokens to sample.

    ``model`` is a local HF checkpoint folder, or ``None`` for the embedded default model.
    ``device`` is a torch device string or ``"auto"`` (CUDA when available, else CPU).
    """

    model: str | None = None
    engine: str = "hf"
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    num_prompts: int = DEFAULT_NUM_PROMPTS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = DEFAULT_SEED
    device: str = "auto"
    metrics: MetricSettings = field(default_factory=MetricSettings)

    def __post_init__(self) -> None:
        if isinstance(self.dtypes, str):
            raise PrecisionConfigError(
                f"dtypes: expected a sequence of dtype names, got the string {self.dtypes!r}; "
                f"pass e.g. ('float16', 'bfloat16')."
            )
        names = [normalize_dtype(d, field_name="dtypes") for d in self.dtypes]
        if not names:
            raise PrecisionConfigError(
                "dtypes: empty; pass at least one of float32, float16, bfloat16."
            )
        ordered = [SELF_CHECK_DTYPE] + [d for d in dict.fromkeys(names) if d != SELF_CHECK_DTYPE]
        object.__setattr__(self, "dtypes", tuple(ordered))
        for name in ("num_prompts", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PrecisionConfigError(
                    f"{name.replace('_', '-')}: {value!r} is not a positive integer; "
                    f"pass a whole number >= 1 (default {globals()['DEFAULT_' + name.upper()]})."
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise PrecisionConfigError(
                f"seed: {self.seed!r} is not a non-negative integer; pass e.g. 0."
            )


@dataclass
class DtypeResult:
    """The measurement for one dtype: metrics, verdict and the raw token log-probs."""

    dtype: str
    metrics: MismatchMetrics
    verdict: str
    reason: str
    train_logprobs: list[list[float]]
    rollout_logprobs: list[list[float]]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every scalar metric, the verdict and the per-sequence sums."""
        out: dict[str, Any] = dict(self.metrics.to_dict())
        out["seq_kl"] = self.metrics.seq_kl
        out["seq_log_ratio"] = list(self.metrics.seq_log_ratio)
        out["seq_lengths"] = list(self.metrics.seq_lengths)
        out["verdict"] = self.verdict
        out["verdict_reason"] = self.reason
        out["seconds"] = round(self.seconds, 3)
        return out


@dataclass
class SelfCheck:
    """Whether the float32 run agrees to the floor, i.e. whether the measurement is valid."""

    passed: bool
    k3_kl: float
    threshold: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "dtype": SELF_CHECK_DTYPE,
            "passed": self.passed,
            "k3_kl": self.k3_kl,
            "threshold": self.threshold,
            "message": self.message,
        }


@dataclass
class ProbeResult:
    """Everything the probe measured; :meth:`to_dict` is the stable JSON schema."""

    model: str
    engine: str
    device: str
    config: ProbeConfig
    results: dict[str, DtypeResult]
    self_check: SelfCheck
    seconds: float = 0.0

    @property
    def valid(self) -> bool:
        """True when the float32 self-check passed."""
        return self.self_check.passed

    def k3_ratio(self, dtype: str, reference: str = "float16") -> float:
        """``k3_kl`` of ``dtype`` divided by that of ``reference`` (NaN when either is missing)."""
        a, b = self.results.get(dtype), self.results.get(reference)
        if a is None or b is None or not b.metrics.k3_kl > 0:
            return math.nan
        return a.metrics.k3_kl / b.metrics.k3_kl

    def to_dict(self) -> dict[str, Any]:
        """``{"model", "engine", "device", "results": {dtype: {...}}, ...}`` (JSON-safe)."""
        data: dict[str, Any] = {
            "model": self.model,
            "engine": self.engine,
            "device": self.device,
            "results": {name: r.to_dict() for name, r in self.results.items()},
            "self_check": self.self_check.to_dict(),
            "bf16_over_fp16_k3": self.k3_ratio("bfloat16", "float16"),
            "settings": {
                "dtypes": list(self.config.dtypes),
                "num_prompts": self.config.num_prompts,
                "max_new_tokens": self.config.max_new_tokens,
                "seed": self.config.seed,
            },
            "seconds": round(self.seconds, 3),
        }
        return _json_safe(data)

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON text of :meth:`to_dict` (NaN/inf written as ``null``)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# -- engines and inputs -----------------------------------------------------------------------


def available_engines() -> dict[str, EngineFactory]:
    """The built-in ``hf`` engine plus every engine the ``precision_probe_engines`` hooks return."""
    from precision_plugin.manager import call_hookimpl, get_plugin_manager

    engines: dict[str, EngineFactory] = {"hf": hf_engine_factory}
    # One hook at a time: a broken plugin must not take the built-in engine down with it.
    for impl in reversed(get_plugin_manager().hook.precision_probe_engines.get_hookimpls()):
        try:
            found = call_hookimpl(impl)
        except Exception as exc:
            log.warning(
                "plugin %r failed to list its probe engines (%s: %s); its engines are skipped",
                impl.plugin_name,
                type(exc).__name__,
                exc,
            )
            continue
        engines.update(found or {})
    return engines


def resolve_device(device: str) -> str:
    """Turn ``"auto"`` into ``cuda``/``cpu``; refuse a device torch cannot use here."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise PrecisionConfigError(
            f"device: {device!r} is not a torch device ({exc}); pass cpu, cuda, cuda:1 or auto."
        ) from None
    xpu = getattr(torch, "xpu", None)
    counts = {
        "cpu": 1,
        "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "mps": 1 if torch.backends.mps.is_available() else 0,
        "xpu": xpu.device_count() if xpu is not None and xpu.is_available() else 0,
    }
    if parsed.type not in counts:
        raise PrecisionConfigError(
            f"device: {device!r} is not a device the probe runs on; pass cpu, cuda, cuda:1, "
            f"mps, xpu or auto."
        )
    found = counts[parsed.type]
    if found == 0:
        label = "CUDA GPU" if parsed.type == "cuda" else f"{parsed.type} device"
        raise PrecisionConfigError(
            f"device: {device!r} was asked for but torch sees no {label} "
            f"(torch {torch.__version__}); pass --device cpu or auto."
        )
    if parsed.index is not None and parsed.index >= found:
        raise PrecisionConfigError(
            f"device: {device!r} was asked for but torch sees {found} {parsed.type} device(s) "
            f"(indices 0..{found - 1}); pass one of those or auto."
        )
    return device


def check_model_dir(path: str) -> Path:
    """Check that ``path`` is a local HF checkpoint folder (with ``config.json``)."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise PrecisionConfigError(
            f"model: {path!r} does not exist; pass a local HF checkpoint folder (config.json, "
            f"weights and tokenizer), or omit --model to probe the embedded default model."
        )
    if not folder.is_dir():
        raise PrecisionConfigError(
            f"model: {path!r} is a file, not a folder; pass the checkpoint folder that holds "
            f"config.json, the weights and the tokenizer."
        )
    if not (folder / "config.json").is_file():
        raise PrecisionConfigError(
            f"model: {path!r} has no config.json, so it is not an HF checkpoint; save one with "
            f"model.save_pretrained(PATH) and tokenizer.save_pretrained(PATH)."
        )
    return folder


def build_prompts(tokenizer: Any, num_prompts: int) -> list[list[int]]:
    """Tokenize the built-in prompts (cycled to ``num_prompts``), all cut to one length.

    The pad token id is removed from every prompt: an engine that derives an attention mask
    from ``input_ids != pad_token_id`` would mask it while a full forward would not (a fake
    float32 mismatch of ~3e-3 in an early version). Equal lengths mean no padding anywhere.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    encoded = []
    for i in range(num_prompts):
        ids = list(tokenizer(PROMPTS[i % len(PROMPTS)]).input_ids)
        encoded.append([t for t in ids if t != pad])
    length = min(MAX_PROMPT_TOKENS, *(len(p) for p in encoded))
    if length < 1:
        raise PrecisionConfigError(
            "model: its tokenizer encodes the probe prompts to no tokens; the probe needs a "
            "tokenizer that encodes plain English text."
        )
    return [p[:length] for p in encoded]


def completion_budgets(num_prompts: int, max_new_tokens: int) -> list[int]:
    """Per-completion length caps spread evenly up to ``max_new_tokens`` (for the length fit)."""
    return [max(1, math.ceil(max_new_tokens * (i + 1) / num_prompts)) for i in range(num_prompts)]


# -- the trainer path ------------------------------------------------------------------------


@contextlib.contextmanager
def trainer_precision(dtype: str, device: str) -> Iterator[None]:
    """Autocast to ``dtype`` as a mixed-precision trainer does (nothing for float32)."""
    import torch

    if dtype == "float32":
        yield
        return
    with torch.autocast(device_type=device.split(":", 1)[0], dtype=getattr(torch, dtype)):
        yield


def trainer_logprobs(
    model: Any, samples: Sequence[RolloutSample], dtype: str, device: str
) -> list[list[float]]:
    """Score each sample's completion with one full-sequence forward, as a trainer does.

    One sequence per forward (no padding), all-ones attention mask, explicit position ids
    ``0..T-1``; log-softmax in float32 of the logits.
    """
    import torch

    out = []
    for sample in samples:
        if not sample.completion_ids:
            out.append([])
            continue
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids], device=device)
        start, total = len(sample.prompt_ids), ids.shape[1]
        with torch.inference_mode(), trainer_precision(dtype, device):
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(total, device=device).unsqueeze(0),
                use_cache=False,
            ).logits
        logp = torch.log_softmax(logits[0, start - 1 : total - 1].float(), dim=-1)
        target = ids[0, start:].unsqueeze(-1)
        out.append(logp.gather(-1, target).squeeze(-1).tolist())
    return out


def _padded(rows: Sequence[Sequence[float]]) -> tuple[Any, Any]:
    import torch

    width = max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), max(width, 1)), math.nan, dtype=torch.float64)
    mask = torch.zeros_like(values, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = True
    return values, mask


def measure(
    train: Sequence[Sequence[float]], rollout: Sequence[Sequence[float]]
) -> MismatchMetrics:
    """``compute_mismatch`` over ragged per-sequence log-prob lists."""
    train_t, mask = _padded(train)
    roll_t, _ = _padded(rollout)
    return compute_mismatch(train_t, roll_t, mask)


def self_check(metrics: MismatchMetrics, settings: MetricSettings) -> SelfCheck:
    """Judge the float32 run: both paths must agree to rounding noise (k3 below the threshold)."""
    threshold = settings.self_check_k3_max
    k3 = metrics.k3_kl
    if metrics.tokens == 0 or not math.isfinite(k3):
        return SelfCheck(False, k3, threshold, "float32 self-check: no comparable tokens.")
    if k3 <= threshold:
        return SelfCheck(
            True, k3, threshold, f"float32 paths agree (k3 {k3:.2e} <= {threshold:g})."
        )
    return SelfCheck(
        False,
        k3,
        threshold,
        f"float32 self-check FAILED: k3 {k3:.2e} > {threshold:g}, so the rollout and trainer "
        f"paths differ for a reason other than precision (padding, attention mask, position "
        f"ids, temperature or sampling settings, TF32 matmuls, different weights) and the "
        f"other dtypes' numbers are not a precision measurement.",
    )


# -- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _model_dir(config: ProbeConfig) -> Iterator[tuple[str, str]]:
    """Yield ``(path, display name)``; the embedded model is saved to a temporary folder."""
    if config.model is not None:
        folder = check_model_dir(config.model)
        yield str(folder), str(config.model)
        return
    from precision_plugin.tiny_model import DEFAULT_MODEL_NAME, save_default_model

    with tempfile.TemporaryDirectory(prefix="precision-probe-") as tmp:
        yield str(save_default_model(tmp)), DEFAULT_MODEL_NAME


#: Below this many parameters, CPU runs use one thread (see :func:`_single_thread_if_tiny`).
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
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PrecisionConfigError(
            f"model: could not load {path!r} as an HF causal LM with its tokenizer ({first}); "
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
    engine = factory(path, dtype, device, config.seed)
    try:
        samples = engine.generate(prompts, config.max_new_tokens, config.seed)
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
    label, reason = verdict(metrics, config.metrics)
    return DtypeResult(dtype, metrics, label, reason, train, rollout, time.perf_counter() - t0)


def run_probe(
    config: ProbeConfig | None = None,
    *,
    engines: dict[str, EngineFactory] | None = None,
    progress: ProgressFn | None = None,
) -> ProbeResult:
    """Run the probe and return its :class:`ProbeResult` (see the module docstring).

    ``engines`` overrides :func:`available_engines` (tests pass their own factories).
    Raises :class:`~precision_plugin.errors.PrecisionConfigError` for bad input.
    """
    config = config or ProbeConfig()
    started = time.perf_counter()
    engines = available_engines() if engines is None else engines
    if config.engine not in engines:
        raise PrecisionConfigError(
            f"engine: {config.engine!r} is not available; available: {', '.join(sorted(engines))}"
            f". Other engines come from plugins (vllm: install the vllm package)."
        )
    factory = engines[config.engine]
    device = resolve_device(config.device)
    n = config.num_prompts
    total = 2 * n * len(config.dtypes)
    done = 0

    def tick(description: str, advance: int) -> None:
        nonlocal done
        done += advance
        if progress is not None:
            progress(description, done, total)

    with _model_dir(config) as (path, name):
        tick("loading the trainer model", 0)
        model, tokenizer = _load_trainer(path, device)
        prompts = build_prompts(tokenizer, n)
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and len(prompts[0]) + config.max_new_tokens > limit:
            raise PrecisionConfigError(
                f"max-new-tokens: {config.max_new_tokens} plus the {len(prompts[0])}-token prompt "
                f"exceeds the model's max_position_embeddings={limit}; pass --max-new-tokens "
                f"{limit - len(prompts[0])} or less."
            )
        budgets = completion_budgets(n, config.max_new_tokens)
        results: dict[str, DtypeResult] = {}
        with _single_thread_if_tiny(model, device):
            for dtype in config.dtypes:
                results[dtype] = _measure_dtype(
                    config, factory, path, device, model, prompts, budgets, dtype, tick
                )
        del model

    check = self_check(results[SELF_CHECK_DTYPE].metrics, config.metrics)
    fp32 = results[SELF_CHECK_DTYPE]
    fp32.verdict, fp32.reason = ("ok" if check.passed else "invalid"), check.message
    if not check.passed:
        log.error("%s", check.message)
        for r in results.values():
            if r.dtype != SELF_CHECK_DTYPE:
                r.verdict, r.reason = "invalid", "float32 self-check failed"
    return ProbeResult(
        model=name,
        engine=config.engine,
        device=device,
        config=config,
        results=results,
        self_check=check,
        seconds=time.perf_counter() - started,
    )
