#!/usr/bin/env bash
# Set up (idempotent) and run the test suite on the CPU (Triton kernels under the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 -q "$@"
