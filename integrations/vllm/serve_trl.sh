#!/usr/bin/env bash
# Serve a model for a TRL trainer in server mode (GRPOConfig(use_vllm=True, vllm_mode="server")),
# with the command TRL 1.16 recommends in place of the deprecated `trl vllm-serve`: plain
# `vllm serve` with the dev mode on and TRL's flags (NCCL weight transfer, processed log-probs,
# no log-prob cap). PRECISION_PLUGIN reaches every vLLM process through precision_plugin's
# vllm.general_plugins entry point: the default --dtype auto becomes the policy dtype.
# The trainer side (PrecisionCallback) asks the server for its dtype at train start.
#   MODEL=/path/to/checkpoint PORT=8000 bash integrations/vllm/serve_trl.sh [extra vllm args]
# vLLM >= 0.30 with multimodal prompts: add --enable-scale-out (TRL's wrapper adds it there).
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
PORT="${PORT:-8000}"
export PRECISION_PLUGIN="${PRECISION_PLUGIN:-float16}"
# /server_info and the weight-transfer endpoints TRL's VLLMClient uses are dev endpoints.
export VLLM_SERVER_DEV_MODE=1
exec vllm serve "$MODEL" \
  --port "$PORT" \
  --weight-transfer-config '{"backend": "nccl"}' \
  --logprobs-mode processed_logprobs \
  --max-logprobs -1 \
  "$@"
