#!/usr/bin/env bash
# Everything the H200 is needed for, in as few device calls as possible. Run from the repo root on
# the GPU machine with the wheels carried (device tool: carry ["wheels"]; wheels/ = ../shared/wheels):
#
#   bash bench/gpu_session.sh tests tune     # ~6 min: GPU-marked tests, full route tuning for sm90
#   bash bench/gpu_session.sh bench e2e      # ~6 min: kernel benchmarks, full-size end to end
#
# Stages: tests | tune | bench | e2e. Results go to $OUT (the device tool's folder) or out/gpu;
# copy what should be committed into bench/results/ and routes/ afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site wheels/*.whl \
  || { echo "error: install the wheels from ../shared/wheels into ./wheels and carry them"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/runtime PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

for stage in "$@"; do
  case "$stage" in
    tests)
      timeout 240 python3 -m pytest -q -m gpu tests/kernels tests/runtime -x 2>&1 | tail -n 40 | tee "$OUT/gpu_tests.log" ;;
    tune)
      timeout 420 python3 -m ninfer_compile.cli tune --sm 90 -o "$OUT/sm90.yaml" --report "$OUT/sm90.md" \
        --save-measurements "$OUT/sm90.meas.json" 2>&1 | tail -n 20 | tee "$OUT/tune.log" ;;
    bench)
      timeout 150 python3 bench/bench_linear.py --quick --budget-s 120 --out "$OUT" 2>&1 | tail -n 40 | tee "$OUT/linear.log"
      timeout 90 python3 bench/bench_gdn.py --out "$OUT" 2>&1 | tail -n 20 | tee "$OUT/gdn.log"
      timeout 60 python3 bench/bench_attention.py --out "$OUT" 2>&1 | tail -n 20 | tee "$OUT/attention.log" ;;
    e2e)
      A=/tmp/q27.ninfer
      [ -f "$A" ] || python3 -m ninfer_compile.cli pack --synthetic qwen3.6-27b -o "$A" --seed 0 2>&1 | tr '\r' '\n' | tail -n 1
      ROUTES=""; [ -f "$OUT/sm90.yaml" ] && ROUTES="--routes $OUT/sm90.yaml"
      for kv in bf16 int8; do
        python3 -m ninfer_compile.cli "$A" --sm 90 $ROUTES --concurrency 1,2,4,8 --max-context 20480 \
          --kv-dtype "$kv" -o "/tmp/p90_$kv" 2>&1 | tail -n 1
        timeout 200 python3 bench/bench_e2e.py --plan "/tmp/p90_$kv" --artifact "$A" --out "$OUT" \
          --label "27b-$kv-kv" --prefill 1024,4096,16384 --context 4096 --concurrency 1,2,4,8 \
          2>&1 | tail -n 25 | tee "$OUT/e2e_$kv.log"
      done ;;
    *) echo "error: unknown stage $stage (tests | tune | bench | e2e)"; exit 2 ;;
  esac
done
