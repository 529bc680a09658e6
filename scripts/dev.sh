#!/usr/bin/env bash
# One entry point for a fresh machine: sets up what it needs, then runs the job.
#   bash scripts/dev.sh probe [probe options]   # the main job: the mismatch probe, embedded model
#   bash scripts/dev.sh test  [pytest options]  # every test, vLLM/verl contract tests, docs build
#   bash scripts/dev.sh setup                   # only the set-up
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="${PRECISION_PLUGIN_VENV:-$root/.venv}"
vllm_venv="${PRECISION_PLUGIN_VLLM_VENV:-$root/.venv-vllm}"
vllm_old_venv="${PRECISION_PLUGIN_VLLM_OLD_VENV:-$root/.venv-vllm-old}"
verl_venv="${PRECISION_PLUGIN_VERL_VENV:-$root/.venv-verl}"
verl_old_venv="${PRECISION_PLUGIN_VERL_OLD_VENV:-$root/.venv-verl-old}"
py="${PYTHON:-python3}"

setup_main() {
  if [ ! -x "$venv/bin/python" ]; then
    echo ">> creating $venv"
    "$py" -m venv "$venv"
  fi
  # -c constraints.txt pins the CPU torch wheel (a bare torch requirement pulls a CUDA build).
  stamp="$venv/.precision_plugin-setup"
  want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo ">> installing precision_plugin and its test/doc dependencies into $venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -c constraints.txt "torch==2.13.0"
    "$venv/bin/python" -m pip install -q -c constraints.txt -e ".[test,docs,plot]"
    echo "$want" > "$stamp"
  fi
}

setup_vllm() {
  # vLLM's wheel is CUDA-only, but its config layer runs on CPU: a separate environment with the
  # CPU torch, vLLM without its deps, and vLLM's pure-Python requirements (tests/contract/).
  bash scripts/setup_vllm_env.sh "$vllm_venv"
  # vLLM 0.10.1: the last line with the cascade-attention flag defaulting to off.
  bash scripts/setup_vllm_env.sh "$vllm_old_venv" old
}

setup_verl() {
  # verl's config layer on the CPU torch, verl without its heavy deps (tests/contract_verl/):
  # 0.9.1 (FSDP engine, verl.plugins) and 0.7.1 (legacy FSDP workers), either side of verl 0.8.
  bash scripts/setup_verl_env.sh "$verl_venv"
  bash scripts/setup_verl_env.sh "$verl_old_venv" old
}

cmd="${1:-}"
shift || true
case "$cmd" in
  setup)
    setup_main
    setup_vllm
    setup_verl
    ;;
  probe)
    setup_main
    exec "$venv/bin/precision-plugin" probe "$@"
    ;;
  test)
    setup_main
    setup_vllm
    setup_verl
    export PRECISION_PLUGIN_VLLM_PYTHON="$vllm_venv/bin/python"
    echo ">> ruff"
    "$venv/bin/ruff" check precision_plugin tests scripts integrations
    echo ">> pytest"
    "$venv/bin/python" -m pytest --ignore=tests/contract --ignore=tests/contract_verl "$@"
    echo ">> pytest (vLLM contract tests, separate environment)"
    "$vllm_venv/bin/python" -m pytest tests/contract -p no:cacheprovider
    echo ">> pytest (vLLM 0.10.1 contract tests, separate environment)"
    "$vllm_old_venv/bin/python" -m pytest tests/contract -p no:cacheprovider
    echo ">> pytest (verl 0.9.1 contract tests, separate environment)"
    "$verl_venv/bin/python" -m pytest tests/contract_verl -p no:cacheprovider
    echo ">> pytest (verl 0.7.1 contract tests, separate environment)"
    "$verl_old_venv/bin/python" -m pytest tests/contract_verl -p no:cacheprovider
    echo ">> mkdocs build --strict"
    NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet --site-dir "$root/.site"
    ;;
  *)
    echo "usage: bash scripts/dev.sh {probe|test|setup} [options]" >&2
    exit 2
    ;;
esac
