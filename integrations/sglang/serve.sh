#!/usr/bin/env bash
# Serve a model with `sglang serve` in the precision policy's dtype (float16 by default).
# PRECISION_PLUGIN reaches every SGLang process through precision_plugin's sglang.srt.plugins
# entry point: it sets the dtype before SGLang resolves its arguments (whatever the checkpoint
# says), checks the traps (--rl-on-policy-target, SGLANG_SANITIZE_NAN_LOGITS, bf16-only paths),
# and verifies the dtype each scheduler builds its model in. Needs a GPU.
#   MODEL=/path/to/checkpoint PORT=30000 bash integrations/sglang/serve.sh [extra sglang args]
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
PORT="${PORT:-30000}"
export PRECISION_PLUGIN="${PRECISION_PLUGIN:-float16}"
exec sglang serve --model-path "$MODEL" \
  --port "$PORT" \
  --kv-cache-dtype auto \
  "$@"
