"""The probe's float16 headroom: the measurement beside the model_type list, in JSON and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from precision_plugin._core.overflow import FP16_MAX, headroom
from precision_plugin.cli import main
from precision_plugin.probe.inputs import build_prompts
from precision_plugin.probe.overflow import check_overflow
from precision_plugin.probe.tiny_model import build_default_model, save_default_model

HOT = "model.layers.2.mlp.down_proj"


@pytest.fixture(scope="module")
def overflowing_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model saved with layer 2's MLP scaled so down_proj reaches 1e6 in float32."""
    from transformers import AutoModelForCausalLM

    folder = save_default_model(tmp_path_factory.mktemp("probe") / "overflowing")
    model = AutoModelForCausalLM.from_pretrained(folder)
    mlp = model.get_submodule("model.layers.2.mlp")
    with torch.no_grad():
        mlp.gate_proj.weight.mul_(30)
        mlp.up_proj.weight.mul_(30)
    ids = torch.randint(3, 200, (1, 32), generator=torch.Generator().manual_seed(0))
    peak = {m.path: m.max_abs for m in headroom(model, ids, margin_bits=3).modules}[HOT]
    with torch.no_grad():
        mlp.down_proj.weight.mul_(1e6 / peak)
    model.save_pretrained(folder)
    return folder


def _config_with_model_type(folder: Path, model_type: str) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["model_type"] = model_type
    path.write_text(json.dumps(config))


def test_model_type_list_sits_beside_the_measurement(tmp_path: Path) -> None:
    model, tokenizer = build_default_model()
    prompts = build_prompts(tokenizer, 3)
    save_default_model(tmp_path)
    healthy = check_overflow(model, prompts, str(tmp_path), 3.0)
    assert healthy.report.ok and healthy.report.batches == 3 and healthy.risks == []
    assert healthy.model_type == "llama"

    _config_with_model_type(tmp_path, "qwen3_moe")  # on the known-overflow list
    risky = check_overflow(model, prompts, str(tmp_path), 3.0)
    assert [f.status for f in risky.risks] == ["warning"]
    assert "qwen3_moe" in risky.risks[0].message
    assert risky.report.ok  # the list warns; the measurement of these weights is clean
    data = risky.to_dict()
    assert data["ok"] is True and data["model_type_risks"][0]["status"] == "warning"

    _config_with_model_type(tmp_path, "gemma2")  # refused by vLLM in float16
    refused = check_overflow(model, prompts, str(tmp_path), 3.0)
    assert [f.status for f in refused.risks] == ["error"]


def test_probe_json_and_table_show_the_overflowing_module(
    overflowing_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "probe.json"
    argv = ["probe", "--model", str(overflowing_checkpoint), "--num-prompts", "2"]
    code = main([*argv, "--max-new-tokens", "4", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    head = data["headroom"]
    model, _ = build_default_model()
    names = {name for name, _ in model.named_modules()}
    assert {m["path"] for m in head["modules"]} <= names
    assert len(head["modules"]) > 20  # every module, not only the table's rows
    assert HOT in head["flagged"] and not head["ok"]
    assert all(p.startswith(("model.layers.2", "model.layers.3")) for p in head["flagged"])
    assert head["recommendation"] == {
        "action": "bfloat16",  # beyond the range: the float16 rollout overflows too
        "modules": [HOT],
        "message": head["recommendation"]["message"],
    }
    hot = next(m for m in head["modules"] if m["path"] == HOT)
    assert hot["max_abs"] > FP16_MAX and hot["margin_bits"] < 0 and hot["flagged"]
    # float16 was not sampled from NaN: it is reported as not run, with the reason.
    fp16 = data["results"]["float16"]
    assert fp16["verdict"] == "invalid" and fp16["tokens"] == 0
    assert HOT in fp16["verdict_reason"] and "not run" in fp16["verdict_reason"]
    assert data["results"]["bfloat16"]["tokens"] > 0
    table = capsys.readouterr().out
    assert "float16 headroom" in table and HOT in table and "bfloat16" in table
