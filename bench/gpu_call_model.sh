#!/usr/bin/env bash
# One model on one GPU in one device call: MODEL=35b (default: the 35B-A3B, issue 33) or MODEL=27b
# (qwen3.6-27b: issues 30 and 31). Parts in order ($PARTS), each bounded:
#   tests   GPU-marked tests (35b: the MoE kernels at the real shapes, the tiny MoE plan on the GPU)
#           (a failure stops the parts that time those kernels)
#   pack    the synthetic artifact (seed 0: the real inventory, random payloads; 35b ~22.8 GB, 27b ~17.5 GB)
#   compile the sm_90 plan with kernel binaries: C = $CONC (35b: 1,8; 27b: 1,2,4,8), the K = 3 MTP
#           extents, context 4608
#   e2e     bench_e2e: prefill 1024 / 4096, decode at C = $CONC, context 4096, the waterfall at C = 1 and 8
#   moe     bench_moe: the router and expert routes at T = 1..64, uniform and skewed routing
#   spec    bench_spec: the K = 3 round at C = 1 and 8 against the plain step, forced acceptance at C = 1
#   load    load_phases: $LOAD_RUNS (2) fresh processes (LOAD_ENV="K=V K=V": alternating child environments) to their first token (before e2e in $PARTS: the
#           first one is the machine's first load)
#   stream  weight_stream_bench: the weight stream's GB/s by readers and buffer size, against the
#           pinned host->device copy measured in the same run (issue 31)
#   tune    the MoE families' rows measured by the tuner (-> $OUT/sm90_moe.yaml)
#   nocs    issue 31's column specialisation A/B: the plan compiled with --no-column-specialization, prefill 1024 / 4096 (A/B
#           against e2e's prefill rows of the default plan in the same call)
# TEST_PATHS / E2E_ARGS override the tests' paths and bench_e2e's measurement arguments (a short call).
# Everything but call.log and gpu_tests.log comes back in results.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_call_common.sh
gpu_call_start
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee -a "$OUT/call.log"
case "${MODEL:=35b}" in
  35b) NAME=qwen3.6-35b-a3b; LABEL=35b-a3b; CONC=${CONC:-1,8}
       DEFAULT_TESTS="tests/kernels/moe tests/runtime/test_moe_e2e.py" ;;
  27b) NAME=qwen3.6-27b; LABEL=27b; CONC=${CONC:-1,2,4,8}
       DEFAULT_TESTS="tests/runtime/test_pinned_upload.py tests/runtime/test_weight_stream.py" ;;
  *) echo "error: MODEL=$MODEL: 35b or 27b"; exit 2 ;;
esac
A=/tmp/m$MODEL.ninfer
P=/tmp/m$MODEL.sm90.plan
ROUTES=${ROUTES:-routes/sm90.yaml}
ok=1
for part in ${PARTS:-tests pack compile e2e moe spec load}; do
  stamp "part $part"
  case "$part" in
    tests)
      timeout ${TESTS_S:-240} python3 -m pytest -q -m gpu ${TEST_PATHS:-$DEFAULT_TESTS} \
        -p no:cacheprovider -rf -n ${GPU_TEST_WORKERS:-4} > "$OUT/gpu_tests.log" 2>&1 || ok=0
      tail -n 3 "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
      grep -m 8 "FAILED\|Error" "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
      if [ "$ok" = 0 ] && [ "$MODEL" = 35b ]; then  # go on with the routes measured before this round's launch savings
        sed -e 's/COMBINE: fused/COMBINE: kernel/' "$ROUTES" > /tmp/sm90_safe.yaml && ROUTES=/tmp/sm90_safe.yaml && ok=1
        echo "GPU tests failed: the timed parts use $ROUTES (no fused combine)" | tee -a "$OUT/call.log"
      elif [ "$ok" = 0 ]; then  # 27b: the pinned upload is what the tests cover: time without it
        export NINFER_PINNED_UPLOAD=0; ok=1
        echo "GPU tests failed: pageable upload" | tee -a "$OUT/call.log"
      fi ;;
    pack)
      [ -f "$A" ] || python3 -m ninfer_compile.cli pack --synthetic $NAME -o "$A" --seed 0 -q 2>&1 | tail -n 2
      ls -la "$A" | tee -a "$OUT/call.log" ;;
    compile)
      /usr/bin/time -f "compile wall %e s, cpu %U+%S s, max rss %M KB" python3 -m ninfer_compile.cli "$A" --sm 90 \
        --routes "$ROUTES" --concurrency $CONC --draft-tokens 3 --max-context 4608 -o "$P" 2>&1 | tail -n 3 \
        | tee -a "$OUT/call.log" ;;
    e2e)
      [ "$ok" = 1 ] || { echo "e2e skipped: the GPU tests failed" | tee -a "$OUT/call.log"; continue; }
      timeout ${E2E_S:-240} python3 bench/bench_e2e.py --plan "$P" --artifact "$A" --out "$OUT" --label $LABEL \
        ${E2E_ARGS:---prefill 1024,4096 --concurrency $CONC --context 4096 --profile 1,8} 2>&1 \
        | grep "^streaming\|^decode\|^prefill\|^profile\|rror" | tee -a "$OUT/call.log" ;;
    moe)
      [ "$ok" = 1 ] || { echo "moe skipped: the GPU tests failed" | tee -a "$OUT/call.log"; continue; }
      timeout $(( ${MOE_S:-150} + 30 )) python3 bench/bench_moe.py --out "$OUT" --budget-s ${MOE_S:-150} ${MOE_T:+--t $MOE_T} 2>&1 \
        | tail -n 40 | tee -a "$OUT/call.log" ;;
    spec)
      [ "$ok" = 1 ] || { echo "spec skipped: the GPU tests failed" | tee -a "$OUT/call.log"; continue; }
      timeout ${SPEC_S:-200} python3 bench/bench_spec.py --plan "$P" --artifact "$A" --out "$OUT" --label $LABEL-k3 \
        --concurrency 1,8 --context 4096 --forced-concurrency 1 --profile 1 2>&1 \
        | grep "^K=\|MTP3\|round\|single\|rror" | head -n 20 | tee -a "$OUT/call.log" ;;
    load)
      timeout ${LOAD_S:-120} python3 bench/load_phases.py --model $NAME --artifact "$A" --sm 90 --runs ${LOAD_RUNS:-2} ${LOAD_ENV:+$(printf -- '--env %s ' $LOAD_ENV)} \
        2>&1 | tee "$OUT/load_phases.log" | tail -n 6 | tee -a "$OUT/call.log" ;;
    stream)
      timeout ${STREAM_S:-120} python3 bench/weight_stream_bench.py --plan "$P" --artifact "$A" 2>&1 \
        | tee "$OUT/weight_stream.log" | grep -v "^json" | tee -a "$OUT/call.log" ;;
    nocs)
      /usr/bin/time -f "compile (no column specialization) wall %e s, cpu %U+%S s" python3 -m ninfer_compile.cli "$A" \
        --sm 90 --routes "$ROUTES" --concurrency $CONC --draft-tokens 3 --max-context 4608 --no-column-specialization \
        -o /tmp/m${MODEL}_nocs.plan 2>&1 | tail -n 2 | tee -a "$OUT/call.log"
      timeout ${NOCS_S:-90} python3 bench/bench_e2e.py --plan /tmp/m${MODEL}_nocs.plan --artifact "$A" --out "$OUT" \
        --label $LABEL-nocs --prefill 1024,4096 --concurrency "" 2>&1 | grep "^prefill\|rror" | tee -a "$OUT/call.log" ;;
    tune)
      timeout ${TUNE_S:-180} python3 -m ninfer_compile.cli tune --sm 90 --families moe_router,moe_experts \
        --contract $NAME --base "$ROUTES" -o "$OUT/sm90_moe.yaml" --report "$OUT/sm90_moe.md" \
        --budget-s ${TUNE_S:-180} 2>&1 | tail -n 6 | tee -a "$OUT/call.log" ;;
  esac
done
gpu_call_pack
