"""Mismatch telemetry, HFRollout and the asked-vs-ran audit with a real TRL GRPOTrainer on CPU.

Models and data are built in code (the recipe's tiny Llama and character tokenizer); nothing of
TRL or transformers is mocked.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

import precision_plugin as pp
from precision_plugin import PrecisionCallback, PrecisionMismatchError
from precision_plugin._base.patching import is_patched
from precision_plugin.trl import HFRollout

RECIPE = Path(__file__).resolve().parents[2] / "integrations/trl/grpo_fp16.py"
CORE = (
    "k1_kl", "k3_kl", "prob_diff_mean", "prob_diff_max", "logp_abs_diff_mean",
    "drift_per_1k", "drift_per_1k_se", "tokens", "nan_tokens",
    "ess", "seq_mask_fraction_trl", "seq_mask_fraction_verl", "tis_clip_fraction",
    "bitwise_equal_frac",
)  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_accelerator_state")]


def _recipe():
    spec = importlib.util.spec_from_file_location("grpo_fp16_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _callback(trainer) -> PrecisionCallback:
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, PrecisionCallback))


def _train_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


class _EnvMaskRollout(HFRollout):
    """HFRollout whose completions hide every third token from the loss, as an environment's
    feedback tokens are hidden: TRL 1.16 turns a ``rollout_func``'s ``env_mask`` into its
    ``tool_mask`` (grpo_trainer.py, "Support custom env_mask from rollout_func")."""

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        out["env_mask"] = [[int(i % 3 != 1) for i in range(len(c))] for c in out["completion_ids"]]
        return out


_INPUTS = ("sampling_per_token_logps", "old_per_token_logps", "completion_mask", "tool_mask")


def _spy(trainer) -> list[dict]:
    """What each ``_compute_loss`` call receives, and the first per-token log-probs computed in
    it (π when TRL keeps no ``old_per_token_logps``), recorded on the trainer instance."""
    calls: list[dict] = []
    compute, logps = trainer._compute_loss, trainer._get_per_token_logps_and_entropies
    inside = [False]

    def spy_compute(model, inputs):
        calls.append({k: inputs[k].detach().clone() for k in _INPUTS if inputs.get(k) is not None})
        inside[0] = True
        try:
            return compute(model, inputs)
        finally:
            inside[0] = False

    def spy_logps(*args, **kwargs):
        result = logps(*args, **kwargs)
        if inside[0] and "pi" not in calls[-1]:
            calls[-1]["pi"] = result[0].detach().clone()
        return result

    trainer._compute_loss, trainer._get_per_token_logps_and_entropies = spy_compute, spy_logps
    return calls


def _expected(call: dict) -> dict[str, float]:
    """The logged metrics of one rollout slice, computed here in float64 from its tensors."""
    pi = call.get("old_per_token_logps", call.get("pi")).double()
    mu = call["sampling_per_token_logps"].double()
    mask = call["completion_mask"].bool()
    if "tool_mask" in call:
        mask = mask & call["tool_mask"].bool()
    d = (pi - mu)[mask]  # log π − log μ over the counted tokens
    rows = [i for i in range(len(mask)) if mask[i].any()]
    sums = [float((pi - mu)[i][mask[i]].sum()) for i in rows]  # S per sequence
    lengths = [int(mask[i].sum()) for i in rows]
    r = sum(sums) / sum(lengths)
    n = len(sums)
    # the random walk S ~ Normal(drift·L, variance·L)
    variance = sum((s - r * x) ** 2 / x for s, x in zip(sums, lengths, strict=True)) / (n - 1)
    weights = [math.exp(s) for s in sums]  # sequence importance weights π(y)/μ(y)
    return {
        "tokens": float(mask.sum()),
        "k1_kl": float((mu - pi)[mask].mean()),  # log μ − log π: KL(μ‖π), positive on average
        "k3_kl": float((torch.expm1(d) - d).mean()),
        "prob_diff_mean": float((pi.exp() - mu.exp())[mask].abs().mean()),
        "prob_diff_max": float((pi.exp() - mu.exp())[mask].abs().max()),
        "logp_abs_diff_mean": float(d.abs().mean()),
        "drift_per_1k": 1000 * r,
        "drift_per_1k_se": 1000 * math.sqrt(variance / sum(lengths)),
        "ess": sum(weights) ** 2 / (n * sum(w * w for w in weights)),
        "seq_mask_fraction_trl": sum(w > 3 for w in weights) / n,  # TRL: sequence_mask, max 3
        "seq_mask_fraction_verl": sum(not 0.5 <= w <= 2 for w in weights) / n,  # Seq-MIS
        "tis_clip_fraction": float((d > math.log(2.0)).double().mean()),  # π/μ > 2
        # float32 bit patterns equal on both sides
        "bitwise_equal_frac": float(
            (
                _bits(call.get("old_per_token_logps", call.get("pi")))
                == _bits(call["sampling_per_token_logps"])
            )[mask]
            .double()
            .mean()
        ),
    }


def _bits(logps: torch.Tensor) -> torch.Tensor:
    return logps.float().view(torch.int32)


@pytest.mark.parametrize(
    "config",
    [
        {"vllm_importance_sampling_correction": True},
        {"vllm_importance_sampling_correction": False, "temperature": 0.7},
        # generation every 2 steps: TRL computes old_per_token_logps, the trainer side used then
        {"vllm_importance_sampling_correction": False, "steps_per_generation": 2},
        {"env_mask": True, "temperature": 1.3},
    ],
    ids=["is-on", "is-off-T0.7", "old-logps", "tool-mask-T1.3"],
)
def test_metrics_every_logging_step_pinned_to_the_trainers_own_tensors(tmp_path, config):
    """Each logged figure equals the one computed here from the tensors TRL hands
    ``_compute_loss`` (π, μ, completion_mask × tool_mask), for temperatures other than 1 and a
    real tool_mask: the sides, the k1 sign, the mask and the token weighting are pinned."""
    pp.enable()
    config = dict(config)
    rollout = _EnvMaskRollout() if config.pop("env_mask", False) else HFRollout()
    trainer = _recipe().build_trainer(str(tmp_path), 4, rollout_func=rollout, **config)
    calls = _spy(trainer)
    trainer.train()
    logs = _train_logs(trainer)
    assert len(logs) == len(calls) == 4
    for entry, call in zip(logs, calls, strict=True):
        assert set(f"precision/{name}" for name in CORE) <= set(entry), entry
        assert entry["precision/nan_tokens"] == 0
        if rollout.__class__ is _EnvMaskRollout:
            assert "tool_mask" in call and not call["tool_mask"].bool().all()
        for name, value in _expected(call).items():
            assert entry[f"precision/{name}"] == pytest.approx(value, rel=1e-9, abs=1e-15), name
    # Every sampled completion token counted exactly once: TRL's completion lengths, summed
    # (TRL counts only tool_mask=1 tokens too).
    per_generation = 8 if config.get("steps_per_generation") == 2 else 4
    generated = sum(
        e["completions/mean_length"] * per_generation
        for e in logs
        if "completions/mean_length" in e
    )
    assert sum(e["precision/tokens"] for e in logs) == pytest.approx(generated)


def test_a_rollout_reused_over_num_iterations_is_counted_once(tmp_path):
    """num_iterations=2: TRL trains twice on each rollout; the second pass adds nothing, so a
    step's figures are those of the slices first seen in it, pinned to TRL's own tensors."""
    pp.enable()
    trainer = _recipe().build_trainer(str(tmp_path), 4, num_iterations=2)
    calls = _spy(trainer)
    trainer.train()
    logs = _train_logs(trainer)
    assert len(logs) == len(calls) == 4
    mu = [c["sampling_per_token_logps"] for c in calls]
    assert [i == 0 or not torch.equal(mu[i], mu[i - 1]) for i in range(4)] == [
        True, False, True, False,
    ]  # fmt: skip
    for step, (entry, call) in enumerate(zip(logs, calls, strict=True)):
        if step % 2:  # the same rollout again
            assert not any(k.startswith("precision/k") for k in entry), entry
            continue
        for name, value in _expected(call).items():
            assert entry[f"precision/{name}"] == pytest.approx(value, rel=1e-9, abs=1e-15), name


def _mean_k3(tmp_path, dtype: str) -> tuple[float, list[dict]]:
    pp.enable(dtype=dtype)
    try:
        trainer = _recipe().build_trainer(str(tmp_path / dtype), 3, seed=1)
        trainer.train()
    finally:
        pp.disable()
    logs = _train_logs(trainer)
    values = [e["precision/k3_kl"] for e in logs]
    return sum(values) / len(values), logs


def test_float16_mismatch_is_far_below_bfloat16_on_the_same_seed(tmp_path):
    fp16, fp16_logs = _mean_k3(tmp_path, "float16")
    bf16, bf16_logs = _mean_k3(tmp_path, "bfloat16")
    for entry in fp16_logs + bf16_logs:
        assert all(math.isfinite(entry[f"precision/{k}"]) for k in CORE)
    assert fp16 > 0 and bf16 / fp16 >= 10, (fp16, bf16)


def test_log_every_and_disabled_metrics(tmp_path):
    pp.enable(metrics={"log_every": 2})
    trainer = _recipe().build_trainer(str(tmp_path / "every2"), 4)
    trainer.train()
    has = ["precision/k3_kl" in e for e in _train_logs(trainer)]
    assert has == [True, False, True, False]
    pp.enable(metrics={"enabled": False})
    trainer = _recipe().build_trainer(str(tmp_path / "off"), 2)
    trainer.train()
    for entry in _train_logs(trainer):
        assert "precision/k3_kl" not in entry and "precision/loss_scale" in entry


def test_hfrollout_follows_the_learner_after_each_optimizer_step(tmp_path):
    pp.enable()
    rollout = HFRollout()
    trainer = _recipe().build_trainer(str(tmp_path), 3, rollout_func=rollout)
    trainer.train()
    assert rollout.dtype == "float16" and rollout.syncs == 3  # built once, refreshed twice
    assert rollout.synced_step == 2 and trainer.state.global_step == 3
    rollout._sync(trainer)  # what the next rollout would do: refresh from the stepped learner
    assert rollout.synced_step == 3 and rollout.syncs == 4
    learner_model = trainer.accelerator.unwrap_model(trainer.model)
    learner = learner_model.state_dict()
    for name, tensor in rollout.engine.model.state_dict().items():
        # exactly the learner's fp32 master weights rounded by .to(float16), as vLLM loads them
        assert tensor.dtype == torch.float16, name
        assert torch.equal(tensor, learner[name].to(torch.float16)), name
    # the RoPE frequencies (non-persistent buffers) stay float32, as vLLM keeps them
    buffers = dict(learner_model.named_buffers())
    for name, buf in rollout.engine.model.named_buffers():
        assert buf.dtype == torch.float32 and torch.equal(buf, buffers[name]), name


@pytest.mark.parametrize(
    "settings",
    [{"temperature": 0.7}, {"temperature": 1.3, "top_p": 0.9, "top_k": 12,
                            "repetition_penalty": 1.2, "min_p": 0.05}],
    ids=["T0.7", "all-settings"],
)  # fmt: skip
def test_hfrollout_samples_with_the_trainers_settings(tmp_path, settings):
    """Each recorded log-prob is the one vLLM's processed_logprobs would give: the logits the
    copy produced, processed as vLLM does with the trainer's settings (temperature once),
    recomputed here by tests/sampling_reference.py."""
    from tests.sampling_reference import logprob, processed_logits

    pp.enable()
    rollout = HFRollout()
    trainer = _recipe().build_trainer(str(tmp_path), 1, rollout_func=rollout, **settings)
    rollout._sync(trainer)  # build the copy now, to watch its logits
    steps: list[torch.Tensor] = []
    handle = rollout.engine.model.register_forward_hook(
        lambda _m, _a, out: steps.append(out.logits[:, -1].detach().clone())
    )
    try:
        out = rollout(["abc", "hello there", "say a word"], trainer)
    finally:
        handle.remove()
    checked = 0
    lengths = [len(completion) for completion in out["completion_ids"]]
    for row, (prompt, completion, logps) in enumerate(
        zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], strict=True)
    ):
        assert 1 <= len(completion) == len(logps) <= 8
        for t, token in enumerate(completion):
            # a finished row leaves the decode batch: at step t the batch holds the rows still
            # running, in prompt order
            place = sum(1 for other in range(row) if lengths[other] > t)
            assert steps[t].shape[0] == sum(1 for n in lengths if n > t)
            expected = processed_logits(steps[t][place], prompt, completion[:t], **settings)
            assert logps[t] == logprob(expected, token), (row, t)
            checked += 1
    assert checked >= 6


def test_audit_refuses_a_rollout_in_another_dtype_before_the_first_step(tmp_path):
    pp.enable(dtype="bfloat16", strictness="error")
    trainer = _recipe().build_trainer(str(tmp_path), 2, rollout_func=HFRollout(dtype="float16"))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(PrecisionMismatchError) as excinfo:
        trainer.train()
    message = str(excinfo.value)
    # at train begin the copy does not exist yet: the request is refused as a request
    assert "HFRollout is asked to run float16" in message and "learner runs bfloat16" in message
    assert trainer.state.global_step == 0
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no optimizer step


def test_audit_warns_in_warn_mode_and_reports_both_sides(tmp_path, caplog):
    pp.enable(dtype="bfloat16")
    trainer = _recipe().build_trainer(str(tmp_path), 1, rollout_func=HFRollout(dtype="float16"))
    with caplog.at_level("WARNING", logger="precision_plugin"):
        trainer.train()
    assert any("HFRollout runs float16" in r.getMessage() for r in caplog.records)
    audit = _callback(trainer).audit()
    assert not audit["consistent"] and set(audit["contradictions"]) == {"rollout"}


def test_consistent_run_audits_float16_on_both_sides(tmp_path, caplog):
    pp.enable()
    trainer = _recipe().build_trainer(str(tmp_path), 1)
    with caplog.at_level("INFO", logger="precision_plugin"):
        trainer.train()
    audit = _callback(trainer).audit()
    learner, rollout = audit["learner"], audit["rollout"]
    assert audit["consistent"] and audit["contradictions"] == {}
    assert learner["forward_dtype"] == "float16" and rollout["dtype"] == "float16"
    assert rollout["engine"] == "HFRollout" and rollout["asked"] == "float16"
    # what the copy holds, read off it: every weight in float16, the RoPE buffers in float32
    copy = trainer.rollout_func.engine.model
    assert rollout["params"] == {"float16": sum(p.numel() for p in copy.parameters())}
    assert rollout["float32_buffers"] == {"float32": sum(b.numel() for b in copy.buffers())}
    assert (learner["args_fp16"], learner["args_bf16"]) == (True, False)
    assert learner["accelerate_mixed_precision"] == "fp16"
    assert list(learner["trainable_params"]) == ["float32"]
    scaler = learner["loss_scaler"]
    assert scaler["class"].endswith("GradScaler") and scaler["scale"] > 0
    assert scaler["growth_interval"] == pp.PrecisionPolicy().loss_scaler.growth_interval
    tables = [r.getMessage() for r in caplog.records if "asked vs ran" in r.getMessage()]
    assert len(tables) == 2  # train begin and first step
    assert "forward_dtype" in tables[1] and "float16" in tables[1]


def test_disable_after_a_run_restores_grpo_trainer_exactly(tmp_path):
    from trl import GRPOTrainer

    names = ("_compute_loss", "_get_per_token_logps_and_entropies")
    originals = {name: vars(GRPOTrainer)[name] for name in names}
    before = dict(vars(GRPOTrainer))
    pp.enable()
    assert all(is_patched(vars(GRPOTrainer)[name]) for name in names)
    _recipe().build_trainer(str(tmp_path), 1).train()
    pp.disable()
    assert {name: vars(GRPOTrainer)[name] for name in names} == originals
    assert dict(vars(GRPOTrainer)) == before


def _tiny_peft_model(recipe):
    from peft import LoraConfig, get_peft_model

    model, _ = recipe.build_model_and_tokenizer()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(model, config)


def test_lora_in_fp16_trains_fp32_adapters_with_a_working_scaler(tmp_path):
    from peft import LoraConfig

    recipe = _recipe()
    pp.enable()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = recipe.build_trainer(str(tmp_path), 3, peft_config=config, learning_rate=1e-2)
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    trainable = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {p.dtype for p in trainable.values()} == {torch.float32}
    assert any(not torch.equal(start[n], p) for n, p in trainable.items())  # it trained
    logs = _train_logs(trainer)
    assert all(e["precision/loss_scale"] > 0 and e["precision/skipped_steps"] == 0 for e in logs)
    assert all("precision/k3_kl" in e for e in logs)
    assert _callback(trainer).audit()["consistent"]


def test_trl_qlora_adapter_cast_is_undone_on_peft_modules(tmp_path):
    """TRL casts trainable adapter weights of a quantized model to bf16 (grpo_trainer.py, "When
    using QLoRA"); the 4-bit base itself needs a GPU, so the model is flagged the way
    transformers flags a bitsandbytes model, and TRL's own code does the cast on PEFT's real
    LoRA modules."""
    recipe = _recipe()
    flagged = _tiny_peft_model(recipe)
    flagged.is_loaded_in_4bit = True
    without = recipe.build_trainer(str(tmp_path / "plain"), 1, model=flagged)
    lora = [p for n, p in without.model.named_parameters() if "lora_" in n]
    assert lora and {p.dtype for p in lora} == {torch.bfloat16}  # TRL's cast really happened

    pp.enable()
    flagged = _tiny_peft_model(recipe)
    flagged.is_loaded_in_4bit = True
    trainer = recipe.build_trainer(str(tmp_path / "plugin"), 2, model=flagged)
    trainer.train()
    lora = {n: p for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert {p.dtype for p in lora.values()} == {torch.float32}
    assert all(e["precision/loss_scale"] > 0 for e in _train_logs(trainer))


def _mismatch_logs(trainer) -> list[dict]:
    return [
        {k: v for k, v in e.items() if k.removeprefix("precision/") in CORE}
        for e in _train_logs(trainer)
    ]


def test_the_callback_alone_measures_what_enable_measures(tmp_path, monkeypatch):
    """callbacks=[PrecisionCallback()] without enable(): the same precision/* metrics, step by
    step, as enable() on the same seed and settings; nothing left on the trainer after train()."""
    from trl import GRPOTrainer

    monkeypatch.setenv("PRECISION_PLUGIN", "bfloat16")  # the callback's and HFRollout's policy
    before = dict(vars(GRPOTrainer))
    alone = _recipe().build_trainer(str(tmp_path / "alone"), 3, seed=2, bf16=True)
    alone.train()
    assert dict(vars(GRPOTrainer)) == before  # nothing patched on the class
    assert not {"_compute_loss", "_get_per_token_logps_and_entropies"} & set(vars(alone))
    assert _callback(alone).trainer is alone  # found without enable()'s binding
    pp.enable(dtype="bfloat16")
    try:
        enabled = _recipe().build_trainer(str(tmp_path / "enabled"), 3, seed=2, bf16=True)
        enabled.train()
    finally:
        pp.disable()
    measured = _mismatch_logs(alone)
    assert len(measured) == 3 and all(set(m) == {f"precision/{k}" for k in CORE} for m in measured)
    assert measured == _mismatch_logs(enabled)
    assert all(m["precision/k3_kl"] > 0 for m in measured)


def test_rollouts_without_log_probs_are_named_once_and_measure_nothing(tmp_path, caplog):
    """TRL's own generation keeps no rollout log-probs: no precision/* mismatch metric can be
    computed, and the run says so once (not once per step), with the fix."""
    from precision_plugin.trl.telemetry import NO_ROLLOUT_LOGPS

    pp.enable()
    try:
        trainer = _recipe().build_trainer(str(tmp_path), 3, rollout="trl")
        with caplog.at_level(logging.WARNING, logger="precision_plugin"):
            trainer.train()
    finally:
        pp.disable()
    assert [r.getMessage() for r in caplog.records].count(NO_ROLLOUT_LOGPS) == 1
    assert "rollout_func=precision_plugin.trl.HFRollout()" in NO_ROLLOUT_LOGPS
    assert _mismatch_logs(trainer) == [{}, {}, {}]
