#!/usr/bin/env bash
# GRPO on GSM8K with verl on one multi-GPU node, one dtype (FP16 by default) on both sides.
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct DATA=$HOME/data/gsm8k bash integrations/verl/run_grpo.sh [overrides]
# MODEL: a Hugging Face model id or local path; DATA: a directory with train.parquet and
# test.parquet (verl's examples/data_preprocess/gsm8k.py writes them); NGPUS: GPUs on this node
# (default 8); DTYPE: float16 (default) or bfloat16. Extra Hydra overrides are appended last.
# precision-plugin verl-overrides adds the rollout and learner dtypes for the installed verl,
# calculate_log_probs (verl's training/rollout_probs_diff_* metrics), the cascade-attention guard
# where the installed vLLM needs it, and PRECISION_PLUGIN for every Ray worker.
set -euo pipefail
MODEL="${MODEL:?set MODEL to a model id or path}"
DATA="${DATA:?set DATA to a directory with train.parquet and test.parquet}"
NGPUS="${NGPUS:-8}"
DTYPE="${DTYPE:-float16}"
OVERRIDES=$(precision-plugin verl-overrides --dtype "$DTYPE")

# $OVERRIDES is unquoted on purpose: one Hydra override per word.
# shellcheck disable=SC2086
exec python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=512 \
  data.max_response_length=1024 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.fsdp_config.param_offload=True \
  trainer.critic_warmup=0 \
  trainer.logger='["console"]' \
  trainer.project_name=precision_plugin_verl \
  trainer.experiment_name="grpo_gsm8k_$DTYPE" \
  trainer.n_gpus_per_node="$NGPUS" \
  trainer.nnodes=1 \
  trainer.save_freq=-1 \
  trainer.test_freq=5 \
  trainer.total_epochs=15 \
  $OVERRIDES "$@"
