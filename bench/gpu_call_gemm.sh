#!/usr/bin/env bash
# Issue 29, one device call (<= 9 minutes wall; parts in priority order, each bounded): the tensor-core
# small-T GEMM routes `<f>_gemm_tc` (kernels/linear/gemm_tc.py).
#   (a) their GPU-marked tests (asm path vs the fp32 reference, bit equality with gemv_tc, split-K
#       reduce kernel vs fused) and the end-to-end greedy-token check through them on the tiny plan;
#   (b) bench_linear over the four large shapes at T in {1,2,3,4,5,8,12,16,17,24,32,48,64}: the new
#       routes (a small sweep of their params) vs the route table's current pick (routes/sm90.yaml,
#       with its params) vs the streaming-read floor, cuBLAS bf16, torch int4 and gemlite A16W4 G64,
#       all in the same process; a cost(T)/cost(1) table last;
#   (c) with the time left: the other 27B shapes and the MTP W8 shapes.
# Wheels (gitignored, carried): pydantic & co, fla (wheels/*.whl), gemlite + tqdm, numpy (only when the
# machine has none). Everything but call.log and gpu_tests.log comes back in results.tgz.
#   run: carry ["wheels"], command "OUT=$OUT bash bench/gpu_call_gemm.sh", timeout_s 600
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_call_common.sh
WALL_S=${WALL_S:-520}          # stop starting parts past this (the run's limit is 600 s)
gpu_call_start
python3 -c "import numpy" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  wheels/numpy/*.whl || echo "numpy unavailable: gemlite will be skipped"
left() { echo $(( WALL_S - SECONDS )); }
stamp "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/call.log"
python3 -c "import gemlite; print('gemlite', gemlite.__version__)" 2>&1 | tail -n 1 | tee -a "$OUT/call.log"

T_LIST=1,2,3,4,5,8,12,16,17,24,32,48,64
BENCH="python3 bench/bench_linear.py --t $T_LIST --table routes/sm90.yaml --new gemm_tc --routes gemm_tc --reps 10 \
  --gemlite-t ${GEMLITE_T:-1,4,8,16,32,64}"

for part in ${PARTS:-tests large1 large2 rest}; do
  [ "$(left)" -gt 20 ] || { stamp "skip $part: out of time"; continue; }
  stamp "part $part"
  case "$part" in
    tests)
      timeout ${TESTS_S:-170} python3 -m pytest -q -m gpu tests/kernels/linear/test_gemm_tc.py \
        tests/runtime/test_runtime_gemm_tc.py -p no:cacheprovider -rf -n ${GPU_TEST_WORKERS:-8} --dist load \
        > "$OUT/gpu_tests.log" 2>&1
      echo "tests rc=$?" | tee -a "$OUT/call.log"
      tail -n 3 "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
      grep -m 8 "FAILED\|Error" "$OUT/gpu_tests.log" | cut -c1-300 | tee -a "$OUT/call.log" ;;
    large1)   # budget: bench_linear stops starting rows after --budget-s
      b=$(( $(left) < 175 ? $(left) - 15 : 160 ))
      timeout $(( b + 35 )) $BENCH --out "$OUT/large1" --shapes gate_up,down --max-candidates 3 --budget-s $b 2>&1 \
        | grep -v "^ *$" | tee "$OUT/large1.log" | grep "^| \|^#\|rror\|unavailable\|needs a\|no pick" | tee -a "$OUT/call.log" ;;
    large2)
      b=$(( $(left) < 175 ? $(left) - 15 : 160 ))
      timeout $(( b + 35 )) $BENCH --out "$OUT/large2" --shapes value_z,head --max-candidates 3 --budget-s $b 2>&1 \
        | grep -v "^ *$" | tee "$OUT/large2.log" | grep "^| \|^#\|rror\|unavailable\|needs a\|no pick" | tee -a "$OUT/call.log" ;;
    rest)
      b=$(( $(left) - 15 ))
      timeout $(( b + 30 )) $BENCH --out "$OUT/rest" --max-candidates 2 --budget-s $b \
        --shapes mtp_gate_up,mtp_down,mtp_qkgv,query_key_attn,output,query_key_gdn,mtp_input,mtp_o 2>&1 \
        | grep -v "^ *$" | tee "$OUT/rest.log" | grep "^| \|^#\|rror\|unavailable\|needs a\|no pick" | tee -a "$OUT/call.log" ;;
    *) stamp "unknown part $part" ;;
  esac
done
gpu_call_pack
