#!/usr/bin/env bash
# Serve a model with plain `vllm serve` in the precision policy's dtype (float16 by default).
# PRECISION_PLUGIN reaches every vLLM process through precision_plugin's vllm.general_plugins
# entry point: it sets the dtype (whatever the checkpoint says), guards cascade attention for the
# installed vLLM, and refuses model types vLLM cannot run in float16 before vLLM does.
#   MODEL=/path/to/checkpoint PORT=8000 bash integrations/vllm/serve_vllm.sh [extra vllm args]
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
PORT="${PORT:-8000}"
export PRECISION_PLUGIN="${PRECISION_PLUGIN:-float16}"
# /server_info (read by precision_plugin.vllm.verify_server and TRL's VLLMClient) is a dev endpoint.
export VLLM_SERVER_DEV_MODE=1
exec vllm serve "$MODEL" \
  --port "$PORT" \
  --kv-cache-dtype auto \
  --logprobs-mode processed_logprobs \
  "$@"
