"""The HF Trainer with ``--deepspeed integrations/deepspeed/zero2_fp16.json`` (and ZeRO-3) on CPU,
and the Accelerate DeepSpeed recipe through ``accelerate launch``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

import torch

import precision_plugin as pp
from precision_plugin.deepspeed import engine_scaler_stats
from tests.integration import ds_cpu
from tests.tiny import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "integrations" / "deepspeed"


@pytest.fixture(autouse=True)
def _fp16_branch(record_property):
    """Each test records which way DeepSpeed's fp16 branch ran here (native or forced)."""
    ds_cpu.record_fp16_branch(record_property)


@pytest.fixture(scope="module")
def ds_env():
    """A one-process DeepSpeed world on CPU, fp16 allowed (see ds_cpu)."""
    with ds_cpu.one_process_world():
        yield


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def _tiny_llama():
    return tiny_llama(max_position_embeddings=32)


def _train(tmp_path, recipe: str, *flags: str):
    from transformers import HfArgumentParser, Trainer, TrainingArguments

    argv = [
        "--output_dir",
        str(tmp_path),
        "--deepspeed",
        str(RECIPES / recipe),
        "--per_device_train_batch_size",
        "2",
        "--max_steps",
        "3",
        "--logging_steps",
        "1",
        "--learning_rate",
        "1e-3",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        *flags,
    ]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv)
    callback = pp.PrecisionCallback()
    trainer = Trainer(model=_tiny_llama(), args=args, train_dataset=_Tokens(), callbacks=[callback])
    callback.bind(trainer)
    result = trainer.train()
    return trainer, result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "flags"),
    [
        ("zero2_fp16.json", ()),
        ("zero2_fp16.json", ("--bf16", "True")),  # TRL's default: bf16=True
        ("zero3_fp16.json", ("--fp16", "True")),
    ],
)
def test_hf_trainer_trains_fp16_from_recipe(ds_env, tmp_path, recipe, flags):
    import deepspeed

    pp.enable()
    trainer, result = _train(tmp_path, recipe, *flags)
    engine = trainer.model_wrapped
    assert isinstance(engine, deepspeed.DeepSpeedEngine)
    assert engine.fp16_enabled() and not engine.bfloat16_enabled()
    assert engine.zero_optimization_stage() == int(recipe[4])
    assert engine.config["fp16"]["loss_scale_window"] == 400  # from the recipe's entry
    assert trainer.state.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
    stats = engine_scaler_stats(engine)
    assert stats.steps == 3 and stats.scale > 0
    logged = [h for h in trainer.state.log_history if "precision/loss_scale" in h]
    assert logged, trainer.state.log_history
    assert logged[-1]["precision/skipped_steps"] == stats.skipped_steps


@pytest.mark.slow
def test_an_accelerator_without_fp16_gets_one_consistent_answer(
    ds_env, tmp_path, monkeypatch, caplog, record_property
):
    """DeepSpeed refuses fp16 here: the plugin runs the engine in float32 and says so once;
    the callback does not then advise enable() (which ran) about the float32 forward."""
    import logging

    from precision_plugin.deepspeed import engine_dtype

    ds_cpu.refuse_fp16(monkeypatch, record_property)  # on any CPU, native or forced
    pp.enable()
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        trainer, _ = _train(tmp_path, "zero2_fp16.json")
    callback = next(
        c for c in trainer.callback_handler.callbacks if isinstance(c, pp.PrecisionCallback)
    )
    assert engine_dtype(trainer.model_wrapped) == "float32"
    assert callback.forward_dtype == torch.float32
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("this engine runs float32 instead" in w for w in warnings) == 1
    assert not any("call precision_plugin.enable()" in w for w in warnings), warnings


@pytest.mark.slow
def test_deepspeed_adapter_alone_settles_hf_flags(ds_env, tmp_path, caplog):
    """Only the DeepSpeed adapter on: it alone reconciles TrainingArguments(bf16=True)."""
    import logging

    pp.enable(skip_adapters=["transformers", "trl", "accelerate"])
    with caplog.at_level(logging.WARNING, logger="precision_plugin"):
        # use_cpu: HF refuses bf16=True on a machine without a bf16 GPU otherwise
        trainer, _ = _train(tmp_path, "zero2_fp16.json", "--bf16", "True", "--use_cpu", "True")
    assert trainer.args.bf16  # the flag itself is not this adapter's business...
    assert trainer.model_wrapped.fp16_enabled()  # ...but DeepSpeed runs the policy
    assert not trainer.model_wrapped.bfloat16_enabled()
    assert "TrainingArguments fp16=False, bf16=True contradict" in caplog.text
    assert "Accelerate mixed_precision='bf16' contradicts" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("skip", [[], ["transformers", "trl", "accelerate"]])
def test_hf_trainer_strict_refuses_contradicting_flags(ds_env, tmp_path, skip):
    pp.enable(strictness="error", skip_adapters=skip)
    with pytest.raises(pp.PrecisionMismatchError, match="bf16"):
        _train(tmp_path, "zero2_fp16.json", "--bf16", "True", "--use_cpu", "True")


@pytest.mark.parametrize(
    ("dtype", "hint"),
    [("float16", "fp16=True, bf16=False"), ("float32", "fp16=False, bf16=False")],
)
def test_contradicting_flags_hint_names_the_policys_own_flags(tmp_path, dtype, hint):
    """The fix names the flags of the policy dtype (a float32 policy wants both off)."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = TrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True)  # before enable
    pp.enable(dtype=dtype, strictness="error", skip_adapters=["transformers", "trl"])
    config = HfTrainerDeepSpeedConfig({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})
    with pytest.raises(pp.PrecisionMismatchError, match=f"Fix: pass {hint} "):
        config.trainer_config_process(args)


ACCELERATE_SCRIPT = """
import json, sys, torch
import precision_plugin as pp
from tests.integration import ds_cpu
from tests.integration.test_deepspeed_hf_trainer import _tiny_llama, _Tokens

import deepspeed
ds_cpu.allow_fp16_on_cpu()
pp.enable()
from accelerate import Accelerator
from precision_plugin.deepspeed import engine_scaler_stats

accelerator = Accelerator()
model = _tiny_llama()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(_Tokens(), batch_size=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, batch in enumerate(loader):
    loss = model(**batch).loss
    if step == 1:
        loss = loss * float("inf")
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if step == 3:
        break
stats = engine_scaler_stats(model)
json.dump({"fp16": model.fp16_enabled(), "bf16": model.bfloat16_enabled(),
           "mixed_precision": accelerator.mixed_precision, "stage": model.zero_optimization_stage(),
           "window": model.config["fp16"]["loss_scale_window"],
           "dtype": str(next(model.module.parameters()).dtype), **stats.to_dict()},
          open(sys.argv[1], "w"))
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_deepspeed_yaml_recipe(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE_SCRIPT)
    out = tmp_path / "out.json"
    env = ds_cpu.launcher_env(ROOT)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "integrations" / "accelerate" / "deepspeed_zero2_fp16.yaml"),
        "--main_process_port",
        str(ds_cpu.free_port()),
        str(script),
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.read_text())
    assert result["fp16"] and not result["bf16"] and result["stage"] == 2
    assert result["mixed_precision"] == "fp16"
    assert result["dtype"] == "torch.float16" and result["window"] == 400
    assert result["steps"] == 4 and result["skipped_steps"] == 1
