#!/usr/bin/env bash
# Build the OpenRLHF contract-test environment (tests/contract_openrlhf/) at the given path.
#   bash scripts/setup_openrlhf_env.sh <venv-dir>
# OpenRLHF 0.11.2 with the vLLM 0.29.0 its [vllm] extra pins, Ray 2.55.0 and DeepSpeed 0.19.6,
# on the local torch 2.13 CPU wheel: the vLLM contract set-up (scripts/setup_vllm_env.sh,
# flavour openrlhf: vLLM and OpenRLHF without their CUDA dependencies, then the pinned
# pure-Python closure). flash-attn, which OpenRLHF hard-requires, needs CUDA to build: the tests
# stub it (tests/contract_openrlhf/conftest.py). OpenRLHF 0.11.0, whose importance-sampling
# flags differ, is installed beside it in <venv-dir>/openrlhf-0.11.0 (PYTHONPATH for its tests).
# Idempotent: stamps skip every install whose inputs did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:?usage: bash scripts/setup_openrlhf_env.sh <venv-dir>}"
bash scripts/setup_vllm_env.sh "$venv" openrlhf

old="openrlhf==0.11.0"
stamp="$venv/.precision_plugin-openrlhf-old"
if [ "$(cat "$stamp" 2>/dev/null)" != "$old" ]; then
  echo ">> installing $old (no dependencies) into $venv/openrlhf-0.11.0"
  rm -rf "$venv/openrlhf-0.11.0"
  "$venv/bin/python" -m pip install -q --no-deps --target "$venv/openrlhf-0.11.0" "$old"
  echo "$old" > "$stamp"
fi
