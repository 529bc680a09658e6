"""Contract tests run in the OpenRLHF environment (scripts/setup_openrlhf_env.sh), on CPU.

The real packages: OpenRLHF 0.11.2 (0.11.0 beside it, in ``<venv>/openrlhf-0.11.0``), vLLM
0.29.0 (its CPU platform, ``VLLM_TARGET_DEVICE=cpu``), Ray 2.55.0 (a local cluster on loopback
with a logical GPU), DeepSpeed 0.19.6 (its CPU accelerator). Stubbed, because they cannot run
without CUDA: flash-attn and vLLM's engine core (``stubs.py`` says exactly how).
"""

from __future__ import annotations

import glob
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("PRECISION_PLUGIN", None)

openrlhf = pytest.importorskip("openrlhf", reason="the OpenRLHF contract environment is not active")

import stubs  # noqa: E402

stubs.install_flash_attn()

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: OpenRLHF 0.11.0, installed beside 0.11.2 by scripts/setup_openrlhf_env.sh.
OLD = Path(sys.prefix) / "openrlhf-0.11.0"

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def llama_dir(tmp_path: Path) -> str:
    """A checkpoint folder holding only ``config.json`` (vLLM's config layer needs no weights)."""
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    return str(folder)


def base_argv(model: str) -> list[str]:
    """A minimal ``train_ppo_ray`` command line: one vLLM engine, a remote reward, no critic."""
    return [
        "--actor.model_name_or_path",
        model,
        "--reward.remote_url",
        "http://127.0.0.1:1",
        "--vllm.num_engines",
        "1",
        "--data.max_len",
        "256",
        "--algo.advantage.estimator",
        "reinforce",
    ]


def run_old(code: str) -> dict[str, str]:
    """Run ``code`` in a fresh interpreter that imports OpenRLHF 0.11.0 (flash-attn stubbed);
    return the ``KEY value`` lines it printed."""
    env = {k: v for k, v in os.environ.items() if k != "PRECISION_PLUGIN"}
    env["PYTHONPATH"] = os.pathsep.join([str(OLD), str(HERE), str(ROOT)])
    prelude = "import stubs; stubs.install_flash_attn()\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + code],
        env=env,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert str(OLD) in out["FILE"], "OpenRLHF 0.11.0 was not the one imported"
    return out


class EnginesBuilt(Exception):
    """Raised where ``train()`` goes on to the learners (which need GPUs): the engines exist."""


class TrainRun:
    """``python -m openrlhf.cli.train_ppo_ray ARGV`` on a local Ray cluster, up to the engines.

    OpenRLHF's real ``__main__`` (parser, validation) and ``train()`` run: its own
    ``ray.init`` (unless Ray is already up), its placement group and ``create_vllm_engines``,
    whose ``RolloutRayActor`` actors build their vLLM engine from OpenRLHF's kwargs, up to
    engine construction (``stubs.stop_at_engine``). ``train()`` is stopped where it creates the
    learners. ``ray.init`` gets, on top of what its caller passes, what a CPU machine needs: a
    logical GPU for OpenRLHF's bundles, loopback, no dashboard, and the test hook in the
    runtime env (its module path, the capture folder, vLLM's CPU platform).
    """

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.capture = tempfile.mkdtemp(prefix="pp-orl-", dir="/tmp")
        # short: Ray's socket paths live under it
        self.ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        self.init_calls: list[dict[str, Any]] = []
        self.engines: list[Any] = []

    def ray_init(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def init(*args: Any, runtime_env: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            self.init_calls.append(json.loads(json.dumps(runtime_env)))
            env = dict(runtime_env or {})
            env["env_vars"] = {
                **env.get("env_vars", {}),
                "PYTHONPATH": str(HERE),
                "PP_TEST_CAPTURE": self.capture,
                "VLLM_TARGET_DEVICE": "cpu",
            }
            env["worker_process_setup_hook"] = "stubs.stop_at_engine"
            return real(
                *args,
                runtime_env=env,
                num_cpus=2,
                num_gpus=1,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=self.ray_tmp,
                **kwargs,
            )

        return init

    def run(self, before: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
        """Run OpenRLHF up to its engines; return one record per engine, with its log lines."""
        import openrlhf.trainer.ray as orl_ray
        import ray

        real_create = orl_ray.create_vllm_engines

        def create(*args: Any, **kwargs: Any) -> Any:
            self.engines = real_create(*args, **kwargs)
            return self.engines

        def stop(*args: Any, **kwargs: Any) -> Any:
            raise EnginesBuilt()

        saved = sys.argv
        try:
            with (
                mock.patch.object(ray, "init", self.ray_init(ray.init)),
                mock.patch.object(orl_ray, "create_vllm_engines", create),
                mock.patch("openrlhf.trainer.ray.launcher.RayActorGroup", stop),
            ):
                if before is not None:
                    before()
                sys.argv = ["train_ppo_ray", *self.argv]
                with pytest.raises(EnginesBuilt):
                    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
            ray.get([engine.__ray_ready__.remote() for engine in self.engines], timeout=300)
            return [self._with_log(record) for record in self._records()]
        finally:
            sys.argv = saved
            ray.shutdown()
            shutil.rmtree(self.capture, ignore_errors=True)
            shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def _records(self) -> list[dict[str, Any]]:
        paths = sorted(glob.glob(os.path.join(self.capture, "engine-*.json")))
        return [json.loads(Path(p).read_text()) for p in paths]

    @staticmethod
    def _with_log(record: dict[str, Any]) -> dict[str, Any]:
        import ray

        logs = ray._private.worker._global_node.get_logs_dir_path()
        lines = []
        for path in glob.glob(os.path.join(logs, f"worker-*-{record['pid']}.err")):
            lines += [
                ln.strip() for ln in Path(path).read_text().splitlines() if "precision_plugin" in ln
            ]
        return {**record, "log": lines}
