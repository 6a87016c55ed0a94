#!/usr/bin/env bash
# Issue 30, lever 1 ("the weight stream never stops"): the early PDL trigger (NINFER_PDL_EARLY) and
# the T=1 GEMVs' L2 weight prefetch before their wait (route param PDL_PREFETCH_BYTES), A/B end to end
# in ONE device call (<= ~9.5 min), every part bounded:
#   build   (background, from the start) the synthetic 27B artifact, then one plan per arm, two at a
#           time (each compile sees its arm's NINFER_PDL_EARLY: the plan's binaries are keyed by it);
#   tests   (foreground, ~195 s at most) the PDL chain in a CUDA graph vs plain launches, bitwise
#           (test_pdl_gpu.py) + test_pdl.py (contract, sm_90 PTX/SASS order); the GPU tests of
#           gemv_lowreg / gemv_tc_w8 / the plain GEMV routes; the tiny model's graphs-vs-eager run
#           under NINFER_PDL_EARLY=1. A failure skips the arms it would invalidate (see below);
#   arms    bench_e2e per arm in a fresh process on the same card: decode C = 1 and 8 at context 4096,
#           32 tokens, --profile 1,8 (waterfall, launches per step); an arm starts only with >= ARM_S
#           left of CALL_S; the 5th arm (16 KB prefetch) only if time is left;
#   summary bench/pdl_arms.py -> $OUT/pdl_ab.md (tok/s, step ms, delta vs base, % of byte floor,
#           launches/step, binaries loaded vs JIT-compiled per arm).
# Arms (name:NINFER_PDL_EARLY:PDL_PREFETCH_BYTES; "-" = the shipped table, i.e. the route default 4096):
#   base:0:0  both:1:-  prefetch:0:-  early:1:0  both16k:1:16384
# Predictions written before the run: bench/results/pdl_prefetch_predictions_2026-12-06.md.
# Everything but call.log, gpu_tests.log and pdl_ab.md comes back in results.tgz (8 files at most).
# run: carry ["wheels"], command "OUT=$OUT bash bench/gpu_call_pdl.sh", timeout_s 600
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}; mkdir -p "$OUT/arms"
CALL_S=${CALL_S:-560}; ARM_S=${ARM_S:-95}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD:$PWD/runtime PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
stamp() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/call.log"; }
stamp "$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -n 1); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
A=/tmp/q27.ninfer
ARMS=${ARMS:-"base:0:0 both:1:- prefetch:0:- early:1:0 both16k:1:16384"}

build_plan() {  # $1 name, $2 NINFER_PDL_EARLY, $3 PDL_PREFETCH_BYTES or -
  local routes=routes/sm90.yaml
  if [ "$3" != "-" ]; then
    routes=/tmp/pdl_routes_$3.yaml
    [ -f "$routes" ] || python3 bench/pdl_arms.py table --bytes "$3" -o "$routes" > /dev/null || return 1
  fi
  NINFER_PDL_EARLY=$2 python3 -m ninfer_compile.cli "$A" --sm 90 --routes "$routes" --concurrency 1,8 \
    --max-context 20480 --kv-dtype bf16 -o "/tmp/p_pdl_$1" > "/tmp/build_$1.log" 2>&1
}
build_all() {
  [ -f "$A" ] || python3 -m ninfer_compile.cli pack --synthetic qwen3.6-27b -o "$A" --seed 0 2>&1 | tr '\r' '\n' | tail -n 1
  local pending="" i=0
  for arm in $ARMS; do
    IFS=: read -r name early bytes <<< "$arm"
    build_plan "$name" "$early" "$bytes" &
    pending="$pending $!"; i=$((i + 1))
    if [ $((i % 2)) = 0 ]; then wait $pending; pending=""; fi
  done
  wait $pending
}
stamp "build: artifact + $(echo $ARMS | wc -w) plans in the background"
( build_all > "$OUT/build.log" 2>&1; echo "build done at +${SECONDS}s" >> "$OUT/build.log" ) &
BUILD=$!

stamp "tests"
# the PDL chain (ids [<NINFER_PDL_EARLY>-<split>]) and the contract: a failure at early=1 skips the early
# arms, at early=0 the late arms with the prefetch on; a cut run (rc 124) proves nothing either way
timeout ${TESTS_S:-75} python3 -m pytest -q -p no:cacheprovider -rf -n ${GPU_TEST_WORKERS:-6} --dist load \
  tests/kernels/linear/test_pdl_gpu.py tests/kernels/test_pdl.py > "$OUT/gpu_tests.log" 2>&1
echo "PDL chain + contract tests rc=$? (124 = cut by the time box)" | tee -a "$OUT/call.log"
tail -n 1 "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
bad_early=0; bad_late=0
grep -q "^FAILED.*test_pdl_gpu.py.*\[1-" "$OUT/gpu_tests.log" && bad_early=1
grep -q "^FAILED.*test_pdl_gpu.py.*\[0-" "$OUT/gpu_tests.log" && bad_late=1
grep -q "^FAILED.*test_pdl.py" "$OUT/gpu_tests.log" && { bad_early=1; bad_late=1; }
timeout ${TESTS2_S:-60} python3 -m pytest -q -m gpu -p no:cacheprovider -rf -n ${GPU_TEST_WORKERS:-6} --dist loadfile \
  tests/kernels/linear/test_gemv_lowreg.py tests/kernels/linear/test_gemv_tc_w8.py \
  tests/kernels/linear/test_linear_gpu.py -k "lowreg or w8 or gemv" >> "$OUT/gpu_tests.log" 2>&1
echo "kernel tests rc=$? (124 = cut by the time box)" | tee -a "$OUT/call.log"; tail -n 1 "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
NINFER_PDL_EARLY=1 timeout ${TESTS3_S:-60} python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
  "tests/runtime/test_runtime_e2e.py::test_gpu_graphs_match_eager_and_repeat" >> "$OUT/gpu_tests.log" 2>&1
rc=$?; echo "tiny model graphs vs eager under NINFER_PDL_EARLY=1: rc=$rc" | tee -a "$OUT/call.log"
[ "$rc" = 1 ] && bad_early=1
grep -m 8 "^FAILED\|Error" "$OUT/gpu_tests.log" | cut -c1-300 | tee -a "$OUT/call.log"
stamp "bad_early=$bad_early bad_late=$bad_late"

stamp "waiting for the build"
while kill -0 $BUILD 2>/dev/null && [ $SECONDS -lt $((CALL_S - 2 * ARM_S)) ]; do sleep 2; done
tail -n 3 "$OUT/build.log" | tee -a "$OUT/call.log"

SUMMARY=""
for arm in $ARMS; do
  IFS=: read -r name early bytes <<< "$arm"
  if [ $((CALL_S - SECONDS)) -lt "$ARM_S" ]; then stamp "arm $name skipped: $((CALL_S - SECONDS)) s left"; continue; fi
  if [ "$early" = 1 ] && [ "$bad_early" = 1 ]; then stamp "arm $name skipped: the early-trigger tests failed"; continue; fi
  if [ "$early" = 0 ] && [ "$bytes" != 0 ] && [ "$bad_late" = 1 ]; then stamp "arm $name skipped: the PDL chain failed"; continue; fi
  [ -f "/tmp/p_pdl_$name/plan.json" ] || { stamp "arm $name skipped: no plan"; tail -n 3 "/tmp/build_$name.log" | tee -a "$OUT/call.log"; continue; }
  stamp "arm $name (NINFER_PDL_EARLY=$early, PDL_PREFETCH_BYTES=$bytes)"
  NINFER_PDL_EARLY=$early timeout "$ARM_S" python3 bench/bench_e2e.py --plan "/tmp/p_pdl_$name" --artifact "$A" \
    --out "$OUT/arms" --label "27b-pdl-$name" --prefill "" --context 4096 --concurrency 1,8 --decode-tokens 32 \
    --profile 1,8 > "$OUT/arms/$name.log" 2>&1
  echo "rc=$?" >> "$OUT/arms/$name.log"
  grep "^decode\|^profile\|rror" "$OUT/arms/$name.log" | head -n 6 | tee -a "$OUT/call.log"
  SUMMARY="$SUMMARY --arm $name=$OUT/arms/e2e_27b-pdl-$name.json"
done
cp /tmp/build_*.log "$OUT/arms/" 2>/dev/null
[ -n "$SUMMARY" ] && python3 bench/pdl_arms.py summary $SUMMARY \
  --predictions bench/results/pdl_prefetch_predictions_2026-12-06.md -o "$OUT/pdl_ab.md" 2>&1 | head -n 40 | tee -a "$OUT/call.log"
kill $BUILD 2>/dev/null
stamp "packing"
tar -C "$OUT" -czf /tmp/results.tgz --exclude call.log --exclude gpu_tests.log --exclude pdl_ab.md . \
  && mv /tmp/results.tgz "$OUT/results.tgz"
find "$OUT" -mindepth 1 -maxdepth 1 ! -name call.log ! -name gpu_tests.log ! -name pdl_ab.md ! -name results.tgz \
  -exec rm -rf {} +
stamp done
