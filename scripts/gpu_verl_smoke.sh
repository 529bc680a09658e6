#!/usr/bin/env bash
# One-GPU GRPO smoke run of verl, FP16 vs BF16, comparing verl's own train/rollout mismatch
# metric training/rollout_probs_diff_mean. Needs a CUDA GPU and verl + vLLM installed (with
# precision_plugin installed normally, not editable); nothing is downloaded: the model is a small
# random-init Qwen2 with a byte tokenizer (tests/gpu/make_qwen2.py), the data a few synthetic
# prompts, the reward a toy rule.
#   bash scripts/gpu_verl_smoke.sh [OUT_DIR] [STEPS]      (defaults: gpu-verl-out, 5)
# Writes OUT_DIR/run-{float16,bfloat16}.log (verl's console), OUT_DIR/summary.json and
# OUT_DIR/summary.md (per-step training/rollout_probs_diff_mean, mean over steps). Record the
# numbers in docs/benchmarks.md ("verl GRPO smoke").
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-verl-out}"
steps="${2:-5}"
py="${PYTHON:-python3}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled

if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_verl_smoke: no CUDA GPU visible; nothing to run." >&2
  exit 0
fi
for mod in verl vllm precision_plugin; do
  if ! "$py" -c "import $mod" 2>/dev/null; then
    echo "gpu_verl_smoke: $mod is not importable with $py; install it first." >&2
    exit 2
  fi
done
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$out/gpu.csv" 2>&1 || true
"$py" -c "import verl, vllm, torch; print('verl', verl.__version__, 'vllm', vllm.__version__, \
'torch', torch.__version__)" | tee "$out/versions.txt"

model="$out/tiny-qwen2"
"$py" -m tests.gpu.make_qwen2 "$model" > /dev/null || exit 1
"$py" - "$model" "$out" <<'PY' || exit 1
import sys
from pathlib import Path

import pandas as pd
from transformers import AutoTokenizer

model, out = sys.argv[1], Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(model)
# verl applies the chat template to every prompt; the byte tokenizer has none.
tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
tok.save_pretrained(model)
rows = [
    {
        "data_source": "smoke",
        "prompt": [{"role": "user", "content": f"Count to {i % 9 + 1} in words:"}],
        "ability": "smoke",
        "reward_model": {"style": "rule", "ground_truth": "one"},
        "extra_info": {"index": i},
    }
    for i in range(256)
]
pd.DataFrame(rows).to_parquet(out / "train.parquet")
pd.DataFrame(rows[:32]).to_parquet(out / "test.parquet")
(out / "reward.py").write_text(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return float(ground_truth in solution_str) + 0.01 * (len(solution_str) % 7)\n"
)
PY

status=0
for dtype in float16 bfloat16; do
  echo ">> verl GRPO, $dtype, $steps steps"
  # shellcheck disable=SC2046
  timeout 1500 "$py" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$out/train.parquet" \
    data.val_files="$out/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=64 \
    data.max_response_length=64 \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path="$model" \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.enforce_eager=True \
    custom_reward_function.path="$out/reward.py" \
    custom_reward_function.name=compute_score \
    trainer.logger='["console"]' \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.total_training_steps="$steps" \
    trainer.project_name=precision_plugin_smoke \
    trainer.experiment_name="grpo_$dtype" \
    trainer.default_local_dir="$out/ckpt-$dtype" \
    $("$py" -m precision_plugin verl-overrides --dtype "$dtype") \
    > "$out/run-$dtype.log" 2>&1
  rc=$?
  echo "   exit $rc (log: $out/run-$dtype.log)"
  [ "$rc" -eq 0 ] || status=1
done

"$py" - "$out" <<'PY'
import json
import re
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
key = "training/rollout_probs_diff_mean"
summary = {}
for dtype in ("float16", "bfloat16"):
    log = out / f"run-{dtype}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    values = [float(v) for v in re.findall(re.escape(key) + r":([-+0-9.eE]+)", text)]
    summary[dtype] = {"per_step": values, "mean": statistics.fmean(values) if values else None}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
lines = [f"| dtype | steps | mean {key} | per step |", "|---|---|---|---|"]
for dtype, s in summary.items():
    mean = f"{s['mean']:.3g}" if s["mean"] is not None else "n/a"
    steps = ", ".join(f"{v:.3g}" for v in s["per_step"])
    lines.append(f"| {dtype} | {len(s['per_step'])} | {mean} | {steps} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit $status
