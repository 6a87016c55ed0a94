#!/usr/bin/env bash
# One device call for issue #17 item 1 (speculative decoding on the H200): the GPU tests of the
# runtime's speculative rounds on the trained tiny model (CUDA graphs = eager = plain, three runs),
# its MTP acceptance through the runtime beside the committed CPU run, then the 27B `spec` stage for
# the draft windows in $SPEC_K. Each part is bounded; timestamps go to $OUT/call.log.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_call_common.sh
gpu_call_start
stamp "gpu tests (speculative + runtime e2e)"
timeout ${SPEC_TESTS_TIMEOUT_S:-150} python3 -m pytest -q -m gpu tests/runtime/test_speculative_e2e.py \
  tests/runtime/test_runtime_e2e.py -p no:cacheprovider -rf > "$OUT/spec_gpu_tests.log" 2>&1
tail -n 4 "$OUT/spec_gpu_tests.log"; grep -m 3 -n "Error\|FAILED" "$OUT/spec_gpu_tests.log"
stamp "runtime acceptance, trained tiny, K = 5 (the CPU run's protocol)"
timeout ${ACC_TIMEOUT_S:-150} python3 bench/quality.py --runtime-acceptance --runtime-k 5 --runtime-prompts 1 \
  --runtime-prompt-tokens 32 --runtime-tokens 16 --out "$OUT/acceptance_gpu_k5.json" > "$OUT/acceptance.log" 2>&1
python3 - "$OUT/acceptance_gpu_k5.json" bench/results/quality_tiny-trained_runtime-acceptance_k5.json <<'PY' 2>&1 | tee -a "$OUT/call.log"
import json, sys
try:
    g, c = (json.load(open(p))["plans"]["5"] for p in sys.argv[1:])
except Exception as e:
    sys.exit(f"acceptance: no result ({e})")
for key in ("runtime_runs", "generated"):
    print(f"acceptance {key}: GPU {g[key]} CPU {c[key]} -> {'equal' if g[key] == c[key] else 'DIFFERENT'}")
print("GPU per K:", [(r["k"], round(r["acceptance"], 4)) for r in g["runtime"]])
PY
stamp "spec stage K = ${SPEC_K:-1 2 3 4 5}"
bash bench/gpu_session.sh spec 2>&1 | grep -v "^\s*$" | tail -n 60
# at most 8 files come back: the logs whose text is above go into call.log
tail -n 20 "$OUT/acceptance.log" >> "$OUT/call.log"; rm -f "$OUT/acceptance.log" "$OUT/gpu.txt" "$OUT/spec.log"
stamp "done"
