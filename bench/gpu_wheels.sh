#!/usr/bin/env bash
# Assemble wheels/ (gitignored) for the GPU machine, which has no network and no pydantic / fla /
# FastAPI: the shared pydantic + fla wheels, and in wheels/serve the server's stack (fastapi 0.165
# imports opentelemetry-api at app construction; uvicorn needs click + h11). Run here, then carry
# ["wheels"] with each device call (bench/gpu_call_final.sh and gpu_session.sh install from it).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p wheels/serve
cp -n ../shared/wheels/*.whl wheels/ 2>/dev/null || true
PY=${PY:-.venv/bin/python}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d wheels/serve \
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 prometheus-client==0.26.0 h11==0.16.0 click==8.5.1 \
  anyio==4.16.0 sniffio==1.3.1 idna==3.20 typing-extensions==4.16.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
ls wheels wheels/serve
