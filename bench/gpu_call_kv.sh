#!/usr/bin/env bash
# One device call: the K = 3 plan's verify round broken down per op beside the plain step
# (bench_spec --profile, C = 1 and 8), then the KV formats end to end for $KV_E2E (stage kve2e) and,
# with SERVE=1, the server at a 32K shared prefix (stage serve). At most 8 files come back.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_call_common.sh
mkdir -p "$OUT"
if [ "${PROFILE:-1}" = 1 ]; then
  stamp "spec profile K=3"
  SPEC_K=3 SPEC_C=1,8 SPEC_FORCED_C="" SPEC_PROFILE=1,8 SPEC_BUDGET_S=200 bash bench/gpu_session.sh spec 2>&1 \
    | grep "^profile\|^K=\|error" | head -n 20
fi
stamp "kve2e ${KV_E2E:-}"
KVE2E_BUDGET_S=${KVE2E_BUDGET_S:-330} bash bench/gpu_session.sh kve2e 2>&1 | grep -v "^\s*$" | tail -n 40
if [ "${SERVE:-0}" = 1 ]; then stamp "serve"; bash bench/gpu_session.sh serve 2>&1 | tail -n 30; fi
rm -f "$OUT/gpu.txt" "$OUT/spec.log"
stamp done
