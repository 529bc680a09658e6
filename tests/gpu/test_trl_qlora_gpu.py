"""QLoRA (bitsandbytes 4-bit base + LoRA) GRPO in fp16 on a GPU: TRL casts the adapters to bf16,
the plugin casts them back to fp32 master weights and the loss scaler steps (skipped without
CUDA, bitsandbytes or PEFT). Run by scripts/gpu_check.sh."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("bitsandbytes", reason="needs bitsandbytes")
pytest.importorskip("peft", reason="needs PEFT")
pytest.importorskip("trl", reason="needs TRL")

import precision_plugin as pp  # noqa: E402

pytestmark = pytest.mark.gpu
RECIPE = Path(__file__).resolve().parents[2] / "integrations/trl/grpo_fp16.py"


def test_qlora_grpo_fp16_trains_fp32_adapters(tmp_path):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    spec = importlib.util.spec_from_file_location("recipe", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    base, _ = recipe.build_model_and_tokenizer()
    base.save_pretrained(tmp_path / "base")
    quantized = AutoModelForCausalLM.from_pretrained(
        tmp_path / "base",
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16
        ),
        device_map={"": 0},
    )
    assert quantized.is_loaded_in_4bit
    pp.enable()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    # HFRollout cannot copy a 4-bit model (bitsandbytes forbids .to(dtype)): TRL's generate.
    trainer = recipe.build_trainer(
        str(tmp_path / "run"), 3, model=quantized, peft_config=lora, rollout="trl"
    )
    trainer.train()
    adapters = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and {p.dtype for p in adapters.values()} == {torch.float32}
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["precision/loss_scale"] > 0 for h in logs)
