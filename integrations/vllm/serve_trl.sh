#!/usr/bin/env bash
# Serve a model for a TRL trainer in server mode (GRPOTrainer(..., args=GRPOConfig(use_vllm=True,
# vllm_mode="server"))). `trl vllm-serve` runs `vllm serve` with the environment it was given, so
# PRECISION_PLUGIN reaches the server: its --dtype default "auto" becomes the policy dtype.
# The trainer side (PrecisionCallback) asks the server for its dtype at train start.
#   MODEL=/path/to/checkpoint PORT=8000 bash integrations/vllm/serve_trl.sh [extra args]
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
PORT="${PORT:-8000}"
export PRECISION_PLUGIN="${PRECISION_PLUGIN:-float16}"
exec trl vllm-serve --model "$MODEL" --port "$PORT" "$@"
