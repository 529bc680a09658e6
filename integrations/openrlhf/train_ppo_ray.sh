#!/usr/bin/env bash
# GRPO (group_norm advantages) with OpenRLHF on one multi-GPU node, one dtype (FP16 by default)
# for its DeepSpeed learner and its vLLM engines. Needs GPUs (and OpenRLHF with vLLM).
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct REWARD_MODEL=... DATA=... bash integrations/openrlhf/train_ppo_ray.sh [args]
# MODEL: the policy (HF id or path); REWARD_MODEL: a reward model (HF id or path); DATA: a prompt
# data set (HF id or path) with chat messages in the column INPUT_KEY (default context_messages);
# NGPUS: GPUs on this node (default 8); DTYPE: float16 (default) or bfloat16. Extra train_ppo_ray
# arguments are appended last.
# precision-plugin openrlhf-args gives the learner's --ds.param_dtype; PRECISION_PLUGIN, exported
# before OpenRLHF starts its local Ray cluster, reaches every actor, so the plugin's vLLM general
# plugin replaces OpenRLHF's hard-coded bf16 in each engine. The check refuses a contradiction
# before any GPU work starts.
set -euo pipefail
MODEL="${MODEL:?set MODEL to a model id or path}"
REWARD_MODEL="${REWARD_MODEL:?set REWARD_MODEL to a reward model id or path}"
DATA="${DATA:?set DATA to a prompt data set id or path}"
INPUT_KEY="${INPUT_KEY:-context_messages}"
NGPUS="${NGPUS:-8}"
DTYPE="${DTYPE:-float16}"
export PRECISION_PLUGIN="${PRECISION_PLUGIN:-$DTYPE}"
# One argument per line of the command's output.
mapfile -t LEARNER < <(precision-plugin openrlhf-args --dtype "$DTYPE")

ARGS=(
  --ref.num_nodes 1 --ref.num_gpus_per_node "$NGPUS"
  --reward.num_nodes 1 --reward.num_gpus_per_node "$NGPUS"
  --actor.num_nodes 1 --actor.num_gpus_per_node "$NGPUS"
  --vllm.num_engines "$NGPUS" --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.6
  --train.colocate_all --vllm.enable_sleep --ds.enable_sleep
  --actor.model_name_or_path "$MODEL"
  --reward.model_name_or_path "$REWARD_MODEL"
  --data.prompt_dataset "$DATA" --data.input_key "$INPUT_KEY" --data.apply_chat_template
  --ckpt.output_dir "./ckpt/grpo_$DTYPE"
  --ds.zero_stage 3 --actor.gradient_checkpointing_enable --ds.packing_samples
  --train.micro_batch_size 4 --train.batch_size 128
  --rollout.micro_batch_size 8 --rollout.batch_size 128 --rollout.n_samples_per_prompt 8
  --train.max_epochs 1 --train.num_episodes 1
  --data.max_len 2048 --rollout.max_new_tokens 1024 --rollout.temperature 1.0
  --actor.adam.lr 5e-7 --algo.advantage.estimator group_norm
  --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 1e-3
  --algo.advantage.is_correction_level token
  "${LEARNER[@]}"
)
precision-plugin openrlhf-args --dtype "$DTYPE" --check -- "${ARGS[@]}" "$@"
exec python3 -m openrlhf.cli.train_ppo_ray "${ARGS[@]}" "$@"
