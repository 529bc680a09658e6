"""Running real DeepSpeed fp16 on a CPU, for the DeepSpeed tests (imported by test processes and
by the worker scripts they launch).

DeepSpeed's CPU accelerator allows fp16 only where oneDNN has native fp16 kernels
(``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX512-FP16 / AMX-FP16 CPUs); elsewhere an
fp16 engine stops with "Type fp16 is not supported on your device". torch itself computes fp16 on
any CPU (slower), so :func:`allow_fp16_on_cpu` lifts that capability check, and only it: the
engine, its optimizers, loss scaler and communication run unchanged.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def single_process_env() -> dict[str, str]:
    """Environment of a one-process DeepSpeed world on loopback (gloo); returns what it set."""
    wanted = {
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
    }
    set_now = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(set_now)
    return set_now


@contextlib.contextmanager
def one_process_world() -> Iterator[Any]:
    """DeepSpeed in a one-process CPU world with fp16 allowed; yields the ``deepspeed`` module.

    On exit everything the DeepSpeed runs left behind in this process is undone, so later tests
    see a clean process: the environment (Accelerate sets ``ACCELERATE_USE_DEEPSPEED=true`` for
    good when given a DeepSpeed plugin), Accelerate's shared state and the fp16 capability check.
    The gloo process group stays: DeepSpeed caches its groups, and later DeepSpeed tests reuse it.
    """
    saved = dict(os.environ)
    single_process_env()
    import deepspeed

    restore = allow_fp16_on_cpu()
    try:
        yield deepspeed
    finally:
        restore()
        with contextlib.suppress(ImportError):
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=True)
        os.environ.clear()
        os.environ.update(saved)


def allow_fp16_on_cpu() -> Any:
    """Lift DeepSpeed's CPU fp16 capability check; return a function that puts it back."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.is_fp16_supported():
        return lambda: None
    acc.is_fp16_supported = lambda: True
    return lambda: vars(acc).pop("is_fp16_supported", None)


def hardware_fp16() -> bool:
    """Whether this CPU's DeepSpeed accelerator runs fp16 by itself (oneDNN fp16 kernels), the
    seam of :func:`allow_fp16_on_cpu` and any test override aside."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    return bool(type(acc).is_fp16_supported(acc))


def refuse_fp16(monkeypatch: Any, record_property: Any) -> None:
    """The branch where DeepSpeed's accelerator refuses fp16, on any CPU: its capability answers
    no for this test (on a CPU with oneDNN fp16 kernels too); the test records which way it ran
    (``deepspeed_fp16_refused``: ``native`` or ``forced``)."""
    from deepspeed.accelerator import get_accelerator

    record_property("deepspeed_fp16_refused", "forced" if hardware_fp16() else "native")
    monkeypatch.setattr(get_accelerator(), "is_fp16_supported", lambda: False)


def record_fp16_branch(record_property: Any) -> None:
    """Record which way a test of the fp16 branch runs (``deepspeed_fp16``): ``native`` on a CPU
    whose accelerator runs fp16, ``forced`` where :func:`allow_fp16_on_cpu` lifts the check."""
    record_property("deepspeed_fp16", "native" if hardware_fp16() else "forced")


def tiny_model(seed: int = 0) -> Any:
    """A two-layer MLP (8 -> 16 -> 4), the same weights for the same seed on every rank."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def ds_config(stage: int, *, section: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A DeepSpeed config that asks for bf16 (the conflict) and carries the plugin entry."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "precision_plugin": section
        if section is not None
        else {"loss_scaler": {"init_scale": 256, "hysteresis": 1, "growth_interval": 1000}},
    }
    cfg.update(extra)
    return cfg


def train_step(engine: Any, *, inject: str | None = None, seed: int | None = None) -> Any:
    """One forward/backward/step on a random batch; ``inject`` ``"inf"``/``"nan"`` poisons the loss
    (hence every gradient) of this step. Returns the (unscaled) loss."""
    import torch

    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    x = torch.randn(2, 8, generator=gen).to(torch.float16)
    loss = engine(x).float().pow(2).mean()
    if inject is not None:
        loss = loss * torch.tensor(float(inject))
    engine.backward(loss)
    engine.step()
    return loss


def full_params(engine: Any) -> list[Any]:
    """Every parameter of the engine's module as a full fp32 CPU tensor (gathered under ZeRO-3)."""
    import deepspeed

    params = list(engine.module.parameters())
    if engine.zero_optimization_stage() == 3:
        with deepspeed.zero.GatheredParameters(params):
            return [p.detach().float().clone() for p in params]
    return [p.detach().float().clone() for p in params]


def launcher_env(root: os.PathLike[str] | str) -> dict[str, str]:
    """Environment for a launcher subprocess (torchrun, accelerate launch) of the DeepSpeed tests.

    The repository is importable, DeepSpeed uses its CPU accelerator, and any rank variables
    this process set for its own one-process world are dropped so the launcher assigns its own.
    """
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    for key in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(key, None)
    return env


def exit_rank(code: int = 0) -> None:
    """End a launched rank once its results are written: barrier, tear the process group down,
    then leave without interpreter shutdown, where a native thread a framework left behind can
    abort the process ("terminate called without an active exception") after the work is done."""
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
