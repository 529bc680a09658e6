#!/usr/bin/env bash
# Build a separate vLLM contract-test environment (tests/contract/) at the given path.
#   bash scripts/setup_vllm_env.sh <venv-dir> [current|old|openrlhf]
#   current: vLLM 0.33.0 (tests/contract/requirements-vllm.txt)
#   old:     vLLM 0.10.1, the last minor release of the cascade-attention bug era (0.8.2 - 0.10.x),
#            where the plugin passes disable_cascade_attn=True (tests/contract/requirements-vllm-old.txt)
#   openrlhf: vLLM 0.29.0 with OpenRLHF 0.11.2, the vLLM its [vllm] extra pins
#            (tests/contract_openrlhf/requirements-openrlhf.txt); scripts/setup_openrlhf_env.sh
#            adds OpenRLHF 0.11.0 beside it
# vLLM's wheels are CUDA-only and pin torch/transformers versions that conflict with the main
# environment; their config layer (EngineArgs, ModelConfig, the CLI parser, general plugins) runs
# on CPU with the local torch 2.13 CPU wheel, vLLM installed without its dependencies, and its
# pure-Python requirements (every version pinned).
# Idempotent: a stamp of the inputs skips the installs; precision_plugin itself is reinstalled (a
# real, non-editable install, so its vllm.general_plugins entry point is real) only when its
# sources change.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/contract_env.sh
source scripts/contract_env.sh
venv="${1:?usage: bash scripts/setup_vllm_env.sh <venv-dir> [current|old]}"
flavour="${2:-current}"
py="${PYTHON:-python3}"
case "$flavour" in
  current)
    vllm_version="0.33.0"
    reqs="tests/contract/requirements-vllm.txt"
    # vLLM pins these; their own dependency metadata would pull CUDA packages.
    no_deps_pins=("xgrammar==0.2.8" "apache-tvm-ffi==0.1.11")
    ;;
  old)
    vllm_version="0.10.1"
    reqs="tests/contract/requirements-vllm-old.txt"
    # vLLM pins these; their own dependency metadata would pull torch 2.7 / triton.
    no_deps_pins=("compressed-tensors==0.10.2" "xgrammar==0.1.21")
    ;;
  openrlhf)
    vllm_version="0.29.0"
    reqs="tests/contract_openrlhf/requirements-openrlhf.txt"
    # vLLM pins the first two; OpenRLHF hard-requires flash-attn (a CUDA build) and more.
    no_deps_pins=("xgrammar==0.2.8" "apache-tvm-ffi==0.1.11" "openrlhf==0.11.2")
    ;;
  *)
    echo "setup_vllm_env.sh: unknown flavour '$flavour'; use 'current', 'old' or 'openrlhf'" >&2
    exit 2
    ;;
esac

if [ ! -x "$venv/bin/python" ]; then
  echo ">> creating $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)

stamp="$venv/.precision_plugin-vllm-deps"
want=$( (cat "$0" "$reqs" constraints.txt; echo "$flavour") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo ">> installing vLLM $vllm_version (no CUDA dependencies) into $venv"
  install_torch "$venv"
  "${pip[@]}" --no-deps "vllm==$vllm_version"
  "${pip[@]}" -c constraints.txt -r "$reqs"
  "${pip[@]}" --no-deps "${no_deps_pins[@]}"
  echo "$want" > "$stamp"
  rm -f "$venv/.precision_plugin-vllm-src"
fi

install_self "$venv" vllm
