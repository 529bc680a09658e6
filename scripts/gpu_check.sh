#!/usr/bin/env bash
# GPU check of the vLLM adapter, for a machine with a CUDA GPU and vLLM installed (nothing is
# downloaded: the model is a small random-init Qwen2 built here).
#   bash scripts/gpu_check.sh [OUT_DIR]        (default: gpu-check-out)
# Writes OUT_DIR/probe-vllm-float16.json, OUT_DIR/probe-vllm-bfloat16.json (precision-plugin
# probe --engine vllm; float32 runs first in each as the self-check), OUT_DIR/doctor.json and
# OUT_DIR/pytest.log (tests/gpu). Record the numbers in docs/vllm.md ("GPU results").
# Then the probe at 4,096 new tokens on a random-init Qwen2.5-1.5B-shaped model (151,936-token
# vocabulary), with the HF engine and with --engine vllm: OUT_DIR/probe-long-{hf,vllm}.json,
# the GPU memory samples next to them, and OUT_DIR/probe-long.md, the rows for
# docs/benchmarks.md ("The probe at 4,096 tokens on a GPU"). LONG=0 skips this part.
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

if [ "${LONG:-1}" != "0" ]; then
  big="$out/qwen2.5-1.5b-shaped"
  "$py" -m tests.gpu.make_qwen2 "$big" --shape qwen2.5-1.5b || exit 1
  for engine in hf vllm; do
    echo ">> probe --engine $engine at 4,096 new tokens (Qwen2.5-1.5B shape, random init)"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 \
      > "$out/probe-long-$engine.gpu-mib" 2>/dev/null &
    smi=$!
    start=$(date +%s)
    timeout 1800 "$py" -m precision_plugin probe --engine "$engine" --model "$big" \
      --device cuda --num-prompts 16 --max-new-tokens 4096 --min-new-tokens 4096 \
      --json "$out/probe-long-$engine.json" > "$out/probe-long-$engine.log" 2>&1 || status=1
    echo "$(( $(date +%s) - start ))" > "$out/probe-long-$engine.seconds"
    kill "$smi" 2>/dev/null
    tail -12 "$out/probe-long-$engine.log"
  done
  "$py" - "$out" > "$out/probe-long.md" <<'PY' || status=1
import json, sys
from pathlib import Path

out = Path(sys.argv[1])


def f(value, spec):
    return "n/a" if value is None else format(value, spec)


print("| engine | dtype | k3 KL | tokens | abs slope/1K (± se) | peak GPU MiB | wall s |")
print("|---|---|---|---|---|---|---|")
for engine in ("hf", "vllm"):
    path = out / f"probe-long-{engine}.json"
    if not path.is_file():
        print(f"| {engine} | (no result: see probe-long-{engine}.log) | | | | | |")
        continue
    data = json.loads(path.read_text())
    mib = [int(x) for x in (out / f"probe-long-{engine}.gpu-mib").read_text().split() if x.isdigit()]
    wall = (out / f"probe-long-{engine}.seconds").read_text().strip()
    for dtype, r in data["results"].items():
        effect = r["length_effect"]
        print(
            f"| {engine} | {dtype} | {f(r['k3_kl'], '.2e')} | {r['tokens']} | "
            f"{f(effect['abs_slope_per_1k'], '.3g')} ± {f(effect['abs_slope_stderr_per_1k'], '.2g')} | "
            f"{max(mib, default=0)} | {wall} |"
        )
PY
  cat "$out/probe-long.md"
fi

echo ">> pytest tests/gpu"
timeout 600 "$py" -m pytest tests/gpu -q -p no:cacheprovider -s > "$out/pytest.log" 2>&1 || status=1
tail -5 "$out/pytest.log"
exit $status
