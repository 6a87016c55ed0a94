#!/usr/bin/env bash
# The session's last device call, parts in priority order, each bounded (the call's limit may be cut
# to the device time left): GPU tests of the kernels new since the last call ($GPU_TESTS; a failure
# stops the timing parts that would use them), the new routes' tuning (stage tune_new -> $OUT/sm90.yaml,
# which the later stages compile with), the K=3 speculative round with its per-op profile, the trained tiny model's acceptance over 8 x 128
# tokens (K = 5 plan -> K' = 1..5), the server
# at a 32K shared prefix, and the plain decode end to end with its waterfall at C = 1 and 8. Everything
# but call.log and gpu_tests.log comes back in results.tgz (at most 8 files come back).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_call_common.sh
gpu_call_start wheels/serve/*.whl
ok=1
if [ -n "${GPU_TESTS:-}" ]; then
  stamp "gpu tests: $GPU_TESTS"
  timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu $GPU_TESTS -p no:cacheprovider -rf -n ${GPU_TEST_WORKERS:-8} \
    --dist ${GPU_TEST_DIST:-loadfile} > "$OUT/gpu_tests.log" 2>&1 || ok=0
  tail -n 3 "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"; grep -m 8 "FAILED\|Error" "$OUT/gpu_tests.log" | tee -a "$OUT/call.log"
fi
[ "$ok" = 1 ] || echo "GPU tests failed: the timing parts run with ROUTES_OFF=1 semantics are the caller's call" | tee -a "$OUT/call.log"
for part in ${PARTS:-tune_new spec acceptance serve e2e}; do
  stamp "part $part"
  case "$part" in
    probe) timeout ${PROBE_S:-200} python3 bench/gemv_probe.py --out "$OUT" --label 27b ${PROBE_OPS:+--ops $PROBE_OPS} 2>&1 | grep "^probe\|rror" | head -n 12 ;;
    ncu) timeout ${NCU_S:-200} python3 bench/gemv_ncu.py --out "$OUT" ${NCU_OPS:+--ops $NCU_OPS} ${NCU_T:+--t $NCU_T} 2>&1 | tail -n 40 ;;
    conv) timeout ${CONV_S:-90} python3 bench/conv_probe.py --out "$OUT" 2>&1 | grep "^conv\|rror" | head -n 12 ;;
    gdn) timeout ${GDN_S:-120} python3 bench/bench_gdn.py --out "$OUT" 2>&1 | grep "^prefill\|^decode\|rror" | head -n 12 ;;
    retune) RETUNE_BUDGET_S=${RETUNE_S:-190} timeout $(( ${RETUNE_S:-190} + 70 )) bash bench/gpu_session.sh retune 2>&1 | tail -n 6 ;;
    tune_new) timeout ${TUNE_S:-200} bash bench/gpu_session.sh tune_new 2>&1 | tail -n 12 ;;
    spec) SPEC_K=${SPEC_K:-3} SPEC_C=${SPEC_C:-1,8} SPEC_FORCED_C=${SPEC_FORCED_C-1} SPEC_PROFILE=${SPEC_PROFILE-1} \
            SPEC_BUDGET_S=${SPEC_BUDGET_S:-150} \
            timeout ${SPEC_S:-240} bash bench/gpu_session.sh spec 2>&1 | grep "^profile\|^K=\|MTP3\|single\|error" | head -n 20 ;;
    acceptance) timeout ${ACC_S:-120} python3 bench/quality.py --runtime-acceptance --runtime-k 5 --runtime-prompts 8 \
            --runtime-tokens 128 --out "$OUT/acceptance_h200_k5_8x128.json" 2>&1 | grep -v "^\s*$" | tail -n 14 ;;
    serve) SERVE_C=${SERVE_C:-1,8} SERVE_LOAD=12 SERVE_TIMEOUT_S=${SERVE_S:-170} bash bench/gpu_session.sh serve 2>&1 | tail -n 24 ;;
    e2e) E2E_KV=bf16 PEERS=0 E2E_PROFILE=${E2E_PROFILE-1,8} timeout ${E2E_S:-200} bash bench/gpu_session.sh e2e 2>&1 \
            | grep "^decode\|^prefill\|^profile\|^load\|error" | head -n 20 ;;
  esac
done
rm -f "$OUT/gpu.txt"
gpu_call_pack
