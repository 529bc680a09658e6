#!/usr/bin/env bash
# Build the separate SGLang contract-test environment (tests/contract_sglang/) at the given path.
#   bash scripts/setup_sglang_env.sh <venv-dir>
# SGLang 0.5.23's wheel is CUDA-only (its requirements pin torch 2.14.1 and CUDA kernels); its
# config layer (ServerArgs, the CLI parser, resolve_once, ModelConfig, the plugin loader and hook
# registry) runs on CPU with the local torch 2.13 CPU wheel, SGLang installed without its
# dependencies, and the pure-Python closure of what that layer imports (every version pinned in
# tests/contract_sglang/requirements-sglang.txt). AReaL 1.0.4 (no dependencies) joins it: its
# config module (areal.api.cli_args) builds SGLang's launch arguments and imports on CPU.
# About 2.5 GB (triton ~1 GB, torch ~0.75 GB).
# Idempotent: a stamp of the inputs skips the installs; precision_plugin itself is reinstalled (a
# real, non-editable install, so its sglang.srt.plugins entry point is real) only when its sources
# change.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/contract_env.sh
source scripts/contract_env.sh
venv="${1:?usage: bash scripts/setup_sglang_env.sh <venv-dir>}"
py="${PYTHON:-python3}"
sglang_version="0.5.23"
areal_version="1.0.4"
reqs="tests/contract_sglang/requirements-sglang.txt"

if [ ! -x "$venv/bin/python" ]; then
  echo ">> creating $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)

stamp="$venv/.precision_plugin-sglang-deps"
want=$( (cat "$0" "$reqs" constraints.txt) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo ">> installing SGLang $sglang_version and AReaL $areal_version (config layers, no CUDA) into $venv"
  install_torch "$venv"
  "${pip[@]}" --no-deps "sglang==$sglang_version" "areal==$areal_version"
  "${pip[@]}" -c constraints.txt -r "$reqs"
  echo "$want" > "$stamp"
  rm -f "$venv/.precision_plugin-sglang-src"
fi

install_self "$venv" sglang
