#!/usr/bin/env bash
# Placeholder: the vLLM contract environment is set up by this script (see tests/contract/).
set -euo pipefail
echo ">> vLLM contract environment: not set up yet"
