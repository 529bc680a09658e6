#!/usr/bin/env bash
# Build the old-vLLM contract-test environment (tests/contract/, vLLM 0.10.1) at the given path.
#   bash scripts/setup_vllm_old_env.sh <venv-dir>
# vLLM 0.10.1 is the last minor release of the cascade-attention bug era (0.8.2 - 0.10.x), where
# the plugin passes disable_cascade_attn=True (tests/contract/test_vllm_old_contract.py). Its wheel
# is CUDA-only and pins torch 2.7.1; its config layer runs on CPU with the local torch 2.13 CPU
# wheel, vLLM installed without its dependencies, and its pure-Python requirements
# (tests/contract/requirements-vllm-old.txt, every version pinned).
# Idempotent: a stamp of the inputs skips the installs; precision_plugin itself is reinstalled (a
# real, non-editable install, so its vllm.general_plugins entry point is real) only when its
# sources change.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:?usage: bash scripts/setup_vllm_old_env.sh <venv-dir>}"
py="${PYTHON:-python3}"
vllm_version="0.10.1"
reqs="tests/contract/requirements-vllm-old.txt"

if [ ! -x "$venv/bin/python" ]; then
  echo ">> creating $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)

stamp="$venv/.precision_plugin-vllm-deps"
want=$(cat "$0" "$reqs" constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo ">> installing vLLM $vllm_version (no CUDA dependencies) into $venv"
  "${pip[@]}" -c constraints.txt "torch==2.13.0"
  "${pip[@]}" --no-deps "vllm==$vllm_version"
  "${pip[@]}" -c constraints.txt -r "$reqs"
  # vLLM pins these two; their own dependency metadata would pull torch 2.7 / triton.
  "${pip[@]}" --no-deps "compressed-tensors==0.10.2" "xgrammar==0.1.21"
  echo "$want" > "$stamp"
  rm -f "$venv/.precision_plugin-vllm-src"
fi

src_stamp="$venv/.precision_plugin-vllm-src"
src=$(find precision_plugin -name '*.py' -o -name 'py.typed' | LC_ALL=C sort | xargs cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$src_stamp" 2>/dev/null)" != "$src" ]; then
  echo ">> installing precision_plugin (non-editable) into $venv"
  "${pip[@]}" --no-deps --force-reinstall .
  echo "$src" > "$src_stamp"
fi
