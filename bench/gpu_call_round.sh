#!/usr/bin/env bash
# Issues 29 and 31, one device call after the gemm_tc kernel bench (bench/gpu_call_gemm.sh): parts in
# priority order, each bounded, <= ~9.5 minutes wall.
#   tests   the GPU-marked tests of the kernels the kernels/linear reorganisation and the fusion
#           deletion touched (inline PTX only runs on the card) and of gemm_tc;
#   retune  the tensor-core routes (gemv_tc, gemm_tc) re-measured at T = 2..64 by the tuner, then the
#           committed measurements + these replayed over routes/sm90.yaml -> $OUT/sm90.yaml;
#   spec    the K = 3 round at C = 1 and 8 against the plain step of the same plan, with $OUT/sm90.yaml;
#   load    a fresh process to its first token, phase by phase (bench/load_phases.py).
# run: carry ["wheels"], command "OUT=$OUT bash bench/gpu_call_round.sh", timeout_s 600
# PARTS picks parts; GPU_TESTS the test paths of part tests; SPEC_S / LOAD_S / TESTS_S bound parts.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_call_common.sh
gpu_call_start
stamp "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
for part in ${PARTS:-tests retune spec load}; do
  stamp "part $part"
  case "$part" in
    tests)
      timeout ${TESTS_S:-110} python3 -m pytest -q -m gpu -p no:cacheprovider -rf -n 8 --dist loadfile \
        ${GPU_TESTS:-tests/kernels/linear/test_gemv_lowreg.py tests/kernels/linear/test_gemv_tc.py \
        tests/kernels/linear/test_gemv_tc_w8.py tests/kernels/linear/test_linear_gpu.py \
        tests/kernels/gdn/test_gdn_chunked_wy.py} > "$OUT/gpu_tests.log" 2>&1
      echo "tests rc=$?" | tee -a "$OUT/call.log"; tail -n 2 "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
      grep -m 8 "^FAILED\|Error" "$OUT/gpu_tests.log" | cut -c1-300 | tee -a "$OUT/call.log" ;;
    retune)
      RETUNE_ROUTES=${RETUNE_ROUTES:-gemm_tc,_gemv_tc} RETUNE_T=${RETUNE_T:-2,3,4,5,8,12,16,17,24,32,48,64} \
        RETUNE_REPS=3 RETUNE_BUDGET_S=${RETUNE_S:-210} bash bench/gpu_session.sh retune 2>&1 | tail -n 5 | tee -a "$OUT/call.log" ;;
    spec)
      SPEC_K=3 SPEC_C=1,8 SPEC_FORCED_C=1 SPEC_PROFILE= SPEC_BUDGET_S=${SPEC_S:-120} \
        timeout 300 bash bench/gpu_session.sh spec 2>&1 | grep "^K=\|MTP\|round\|plain\|single\|rror" | head -n 24 | tee -a "$OUT/call.log" ;;
    load)
      timeout ${LOAD_S:-150} python3 bench/load_phases.py --artifact /tmp/q27.ninfer --runs 1 --dir /tmp/load 2>&1 \
        | tail -n 20 | tee -a "$OUT/call.log" ;;
  esac
done
rm -f "$OUT/gpu.txt"
gpu_call_pack
