#!/usr/bin/env bash
# GPU check of the vLLM adapter, for a machine with a CUDA GPU and vLLM installed (nothing is
# downloaded: the model is a small random-init Qwen2 built here).
#   bash scripts/gpu_check.sh [OUT_DIR]        (default: gpu-check-out)
# Writes OUT_DIR/probe-vllm-float16.json, OUT_DIR/probe-vllm-bfloat16.json (precision-plugin
# probe --engine vllm; float32 runs first in each as the self-check), OUT_DIR/doctor.json and
# OUT_DIR/pytest.log (tests/gpu). Record the numbers in docs/vllm.md ("GPU results").
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check-out}"
py="${PYTHON:-python3}"
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible; nothing to check." >&2
  exit 0
fi
if ! "$py" -c "import vllm" 2>/dev/null; then
  echo "gpu_check: vLLM is not installed in $py; pip install vllm first." >&2
  exit 2
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$out/gpu.csv" 2>&1 || true
"$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
  | tee "$out/versions.txt"

model="$out/tiny-qwen2"
"$py" -m tests.gpu.make_qwen2 "$model" || exit 1
"$py" -m precision_plugin doctor --json > "$out/doctor.json" 2>"$out/doctor.log"

status=0
for dtype in float16 bfloat16; do
  echo ">> probe --engine vllm --dtypes $dtype"
  timeout 600 "$py" -m precision_plugin probe --engine vllm --model "$model" --device cuda \
    --dtypes "$dtype" --json "$out/probe-vllm-$dtype.json" 2>&1 | tee "$out/probe-vllm-$dtype.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
echo ">> probe --engine hf (same model, for comparison)"
timeout 600 "$py" -m precision_plugin probe --engine hf --model "$model" --device cuda \
  --json "$out/probe-hf.json" > "$out/probe-hf.log" 2>&1 || status=1

echo ">> pytest tests/gpu"
timeout 600 "$py" -m pytest tests/gpu -q -p no:cacheprovider -s > "$out/pytest.log" 2>&1 || status=1
tail -5 "$out/pytest.log"
exit $status
