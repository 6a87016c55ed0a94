#!/usr/bin/env bash
# Create .venv and install ninfer-compile with its test dependencies.
# torch==2.13.0 (CPU build, on local disk) goes in first so no CUDA build is ever downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[test,serve]"
