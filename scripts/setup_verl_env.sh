#!/usr/bin/env bash
# Build a separate verl contract-test environment (tests/contract_verl/) at the given path.
#   bash scripts/setup_verl_env.sh <venv-dir> [current|old]
#   current: verl 0.9.1, FSDP engine (mixed_precision.param_dtype), verl.plugins entry points
#            (tests/contract_verl/requirements-verl.txt)
#   old:     verl 0.7.1, the last minor release with the legacy FSDP workers (fsdp_config.dtype)
#            (tests/contract_verl/requirements-verl-old.txt)
# verl's full dependency set (ray[default], wandb, datasets, pyarrow, ...) is ~1.9 GB; the
# contract tests need only its config layer (Hydra compose of ppo_trainer, omega_conf_to_dataclass)
# and `import verl`, which run on the local torch 2.13 CPU wheel. So: verl without its
# dependencies, then the pinned closure of what that layer imports. vLLM, SGLang, flash-attn and
# Megatron are not needed.
# Idempotent: a stamp of the inputs skips the installs; precision_plugin itself is reinstalled (a
# real, non-editable install, so its verl.plugins entry point is real) only when its sources
# change.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/contract_env.sh
source scripts/contract_env.sh
venv="${1:?usage: bash scripts/setup_verl_env.sh <venv-dir> [current|old]}"
flavour="${2:-current}"
py="${PYTHON:-python3}"
case "$flavour" in
  current)
    verl_version="0.9.1"
    reqs="tests/contract_verl/requirements-verl.txt"
    ;;
  old)
    verl_version="0.7.1"
    reqs="tests/contract_verl/requirements-verl-old.txt"
    ;;
  *)
    echo "setup_verl_env.sh: unknown flavour '$flavour'; use 'current' or 'old'" >&2
    exit 2
    ;;
esac

if [ ! -x "$venv/bin/python" ]; then
  echo ">> creating $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)

stamp="$venv/.precision_plugin-verl-deps"
want=$( (cat "$0" "$reqs" constraints.txt; echo "$flavour") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo ">> installing verl $verl_version (config layer only) into $venv"
  install_torch "$venv"
  "${pip[@]}" --no-deps "verl==$verl_version"
  "${pip[@]}" -c constraints.txt -r "$reqs"
  echo "$want" > "$stamp"
  rm -f "$venv/.precision_plugin-verl-src"
fi

install_self "$venv" verl
