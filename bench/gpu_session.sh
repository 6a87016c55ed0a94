#!/usr/bin/env bash
# Everything the H200 is needed for, in as few device calls as possible. Run from the repo root on
# the GPU machine with the wheels carried (device tool: carry ["wheels"]; wheels/ = ../shared/wheels):
#
#   bash bench/gpu_session.sh tests gemv     # ~5 min: GPU-marked tests (full log in $OUT), decode GEMVs
#                                            #   re-measured and merged with the committed linear run
#   bash bench/gpu_session.sh tune           # ~5 min: full route tuning for sm90 (all families)
#   bash bench/gpu_session.sh bench          # ~2 min: kernel benchmarks with same-run peers
#   bash bench/gpu_session.sh e2e            # ~6 min: full-size end to end (bf16 + int8 KV), then the peers
#                                            #   (E2E_KV=bf16: ~3 min; PEERS=0 skips the peers)
#   bash bench/gpu_session.sh spec           # speculative decoding (not yet timed on the H200): one plan per
#                                            #   K in $SPEC_K (default "1 2 3 4 5") with --draft-tokens K, then
#                                            #   bench/bench_spec.py over all of them (round / plain step, MTP
#                                            #   draft cost, forced-acceptance and modelled tok/s, targets);
#                                            #   five 27B compiles may not fit one 10-min call: SPEC_K="1 2 3",
#                                            #   then "4 5", then bench_spec.py --merge the two JSON files
#   bash bench/aot_check.sh                  # ~2.5 min: plan binaries loaded by the runtime without a JIT
#   bash bench/gpu_session.sh kve2e          # the seven KV formats end to end (decode at 4K / 32K, prefill 4K)
#   bash bench/gpu_session.sh serve          # ninfer-serve: TTFT / per-token at C = 1..8, a 32K shared prefix
#   bash bench/gpu_session.sh kv             # the KV formats (issue 15): their kernel tests on the GPU, then
#                                            #   bench/bench_kv.py (decode 4K / 32K, prefill, append, oracle error)
#   bash bench/gpu_session.sh tune_new       # <= TUNE_NEW_S (420 s; estimate ~5.5 min, not yet timed): the cases
#                                            #   routes/sm90.yaml has no measured group for (the verify routes at
#                                            #   K = 1..5 x C = 1, 2, 4, 8 and the MTP draft head first, then the
#                                            #   newer KV formats), replayed with the committed measurements into
#                                            #   $OUT/sm90.yaml
#
# Stages: tests | tune | retune | gemv | cliff | bench | e2e | peers | spec | kv | kve2e | serve | tune_new. Results go to $OUT (the device tool's folder) or
# out/gpu; copy what should be committed into bench/results/ (reports, listed in its README.md), routes/ (tables)
# and routes/measurements/sm90/ (measurement files a table is replayed from; add them to COMMITTED_MEAS) afterwards.
# e2e: our engine for each KV dtype in $E2E_KV (default "bf16 int8"), then the peers (HF
# transformers eager bf16 and the fp32 reference under torch.compile, bench/bench_peers.py) in
# what is left of $E2E_BUDGET_S (default 540 s, so one 10-minute device call stays safe);
# PEERS=0 skips them. peers: the peers alone (their own call if e2e left them too little time).
# Timings above are from the 2026-11-29 H200 calls (e2e + peers took 349 s in all).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site wheels/*.whl \
  || { echo "error: install the wheels from ../shared/wheels into ./wheels and carry them"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/runtime PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

A=/tmp/q27.ninfer
# every committed sm90 measurement, oldest first (a replay lets later files win): routes/sm90.yaml is
# their replay plus the fuse_off header; a stage that re-measures some routes replays this list + its
# own file over routes/sm90.yaml; they live next to the table they rebuild
R=routes/measurements/sm90
COMMITTED_MEAS="$R/tune_sm90_linear_2026-11-29.meas.json $R/tune_sm90_gemv_2026-11-29.meas.json
  $R/tune_sm90_gemv2_2026-11-29.meas.json $R/tune_sm90_gemv_tc_2026-11-29.meas.json
  $R/tune_sm90_quick_2026-11-29.meas.json $R/tune_sm90_cliff_2026-12-01.meas.json
  $R/tune_sm90_gemv_fused_2026-12-01.meas.json $R/tune_sm90_attn_gating_2026-12-01.meas.json
  $R/tune_sm90_new_2026-12-02.meas.json $R/tune_sm90_gemv_tc_fence_2026-12-02.meas.json
  $R/tune_sm90_gdn_prefill_2026-12-03.meas.json $R/tune_sm90_gemv_tc_shfl_2026-12-03.meas.json"
replay_committed() {  # the committed measurements + the given files -> $OUT/sm90.yaml (+ .md)
  python3 -m ninfer_compile.cli tune --sm 90 --replay $COMMITTED_MEAS "$@" --base routes/sm90.yaml \
    -o "$OUT/sm90.yaml" --report "$OUT/sm90.md" 2>&1 | tail -n 1
}
ensure_artifact() {
  [ -f "$A" ] || python3 -m ninfer_compile.cli pack --synthetic qwen3.6-27b -o "$A" --seed 0 2>&1 | tr '\r' '\n' | tail -n 1
}
# Peers in at most $1 seconds: HF 27B build + 4K prefill + 16 decode steps at C=1 and 4, then the
# reference (fp32 weights streamed to the GPU, eager 4K prefill, torch.compile + 16 decode steps).
run_peers() {
  local left=$1
  if [ "$left" -lt 150 ]; then
    echo "peers skipped: ${left} s left of the stage budget; run the stage 'peers' in its own call" | tee "$OUT/peers.log"
    return
  fi
  timeout $((left + 30)) python3 bench/bench_peers.py --out "$OUT" --label 27b --artifact "$A" \
    --contract qwen3.6-27b --context 4096 --decode-tokens 16 --concurrency 1,4 \
    --timeout-hf 240 --timeout-reference 330 --budget-s "$left" 2>&1 | tail -n 40 | tee "$OUT/peers.log"
}

for stage in "$@"; do
  case "$stage" in
    tests)
      # full log kept: one illegal memory access poisons the CUDA context for every later test,
      # so the first failure in the log is the one that matters
      # the whole GPU suite (288 tests) took ~16 min on the H200 in one process (70 tests in 240 s:
      # each 27B-shape test JITs its kernels, CPU-bound): GPU_TEST_WORKERS processes (pytest-xdist,
      # in the H200 image; default 8 of its 16 cores, one file per worker) share the JIT; GPU_TESTS
      # picks paths / node ids, TESTS_TIMEOUT_S the limit. Not yet timed with workers.
      timeout ${TESTS_TIMEOUT_S:-240} python3 -m pytest -q -m gpu ${GPU_TESTS:-tests/kernels tests/runtime} -p no:cacheprovider -rf \
        -n ${GPU_TEST_WORKERS:-8} --dist loadfile \
        > "$OUT/gpu_tests.log" 2>&1; grep -m 3 -n "Error\|FAILED" "$OUT/gpu_tests.log"; tail -n 3 "$OUT/gpu_tests.log" ;;
    gemv)
      # re-measure only the decode GEMVs (lowreg / packed / tensor-core, T <= 16) and merge with the
      # committed linear measurements (later files win)
      # an illegal access would poison the tuner's CUDA context for every later candidate: the
      # never-run tensor-core GEMVs are tuned only after their GPU tests pass in their own process
      # GEMV_ROUTES: the decode GEMVs re-measured besides the tensor-core ones ("" = only those)
      SEL=${GEMV_ROUTES-lowreg,packed}
      if timeout 150 python3 -m pytest -q -m gpu tests/kernels/linear/test_gemv_tc.py -x -p no:cacheprovider \
          -k "splitk_view_large_k or (asm_path_on_gpu and none)" > "$OUT/gemv_tc_gpu_tests.log" 2>&1; then
        SEL=${SEL:+$SEL,}_gemv_tc
      else
        echo "gemv_tc GPU tests failed: not tuned (see gemv_tc_gpu_tests.log)"; tail -n 5 "$OUT/gemv_tc_gpu_tests.log"
      fi
      [ -n "$SEL" ] || { echo "gemv: nothing to measure"; continue; }
      timeout ${GEMV_TIMEOUT_S:-360} python3 -m ninfer_compile.cli tune --sm 90 --families linear --t-points 1,2,3,4,5,8,12,16 \
        --routes "$SEL" --save-measurements "$OUT/gemv.meas.json" 2>&1 | tr '\r' '\n' \
        | grep -v "^ *$" | grep -v "it/s\|run/s\|job/s" | tail -n 8 | tee "$OUT/gemv_tune.log"
      replay_committed "$OUT/gemv.meas.json" ;;
    cliff)
      # the T = 17..32 decode cliff: the tensor-core GEMV (16-column slices, domain T <= 32) against the
      # tiled schedules at T 17 / 24 / 32, merged with every committed linear measurement (later wins)
      timeout ${CLIFF_TIMEOUT_S:-300} python3 -m ninfer_compile.cli tune --sm 90 --families linear --t-points 17,24,32 \
        --routes "_gemv_tc,small_t_mma,dequant_gemm" --save-measurements "$OUT/cliff.meas.json" 2>&1 | tr '\r' '\n' \
        | grep -v "^ *$" | grep -v "it/s\|run/s\|job/s" | tail -n 8 | tee "$OUT/cliff_tune.log"
      replay_committed "$OUT/cliff.meas.json" ;;
    tune_new)
      # the rows added by hand in stops 10-11 (marked untimed in routes/sm90.yaml), measured: the cases
      # sm90.yaml has no measured group for (--untimed-in), at --quick --candidates 3, in two parts that
      # share TUNE_NEW_S (default 420; the whole stage stays under it, a part starts no case past its
      # --budget-s and names the ones it left out in tune_new.log; part 1 gets TUNE_NEW_VERIFY_S = 170,
      # part 2 the rest, skipped under 60 s):
      #  1. the verify routes -- gdn_recurrent_verify, conv1d_verify, attention_decode_splitkv and
      #     attention_verify_packed (bf16 /
      #     int8 KV) and gdn_gating_proj_rows at phase verify, state_select_copy (both state shapes),
      #     spec_accept_rows, draft windows K = 1..5 at the round sizes C x (K+1), C = 1, 2, 4, 8 -- the
      #     MTP draft head's linear and sample_per_slot (~700 timings, est. ~100 s); replayed at once into $OUT/sm90.yaml
      #     (the later stages of a call compile with it);
      #  2. fp8 k8v4 rk8v4 nvfp4 rk4v4: attention decode / prefill / verify, kv_append (~1,250 timings,
      #     est. ~210 s), the cases part 1's table still lacks.
      # Each replay merges the committed measurements (routes/sm90.yaml's provenance order), this call's
      # gemv / cliff ones if any and the new ones over routes/sm90.yaml: the committed measured groups
      # stay except the Q4 fallback {Q4G64_F16S, none}, which now also sums the draft head's shape
      # (tests/tune/test_tune_new.py). $OUT/tune_new.meas.json: both parts merged;
      # $OUT/tune_new_only.yaml / .md: the new groups alone with their timing grid. Log: tune_new.log.
      T0=$SECONDS; TOTAL=${TUNE_NEW_S:-420}; : > "$OUT/tune_new.log"
      EXTRA=""; for f in gemv cliff; do [ -f "$OUT/$f.meas.json" ] && EXTRA="$EXTRA $OUT/$f.meas.json"; done
      tn_tune() {  # $1 = seconds for this part, $2 = measurements file, the rest: tune options
        local left=$1 file=$2; shift 2
        [ "$left" -ge 60 ] || { echo "tune_new: ${left} s left, $(basename "$file") skipped" | tee -a "$OUT/tune_new.log"; return 1; }
        timeout $((left - 10)) python3 -m ninfer_compile.cli tune --sm 90 --quick --candidates ${TUNE_NEW_CANDIDATES:-3} \
          --budget-s $((left - 45)) --save-measurements "$file" "$@" 2>&1 | tr '\r' '\n' | grep -v "^ *$" \
          | grep -v "it/s\|run/s\|job/s" > "$OUT/tune_new.part.log"
        cat "$OUT/tune_new.part.log" >> "$OUT/tune_new.log"
        head -n 2 "$OUT/tune_new.part.log" | cut -c1-300
        grep "^precompiled\|^warning: --budget-s" "$OUT/tune_new.part.log" | cut -c1-300
        [ -f "$file" ] || { echo "tune_new: no measurements in $(basename "$file") (see tune_new.log)"; return 1; }
      }
      tn_replay() { replay_committed $EXTRA "$@" | tee -a "$OUT/tune_new.log"; }
      rm -f "$OUT/tune_new_verify.meas.json" "$OUT/tune_new_kv.meas.json"
      NEW=""
      P1=${TUNE_NEW_VERIFY_S:-170}; [ "$P1" -le $(( TOTAL - 15 )) ] || P1=$(( TOTAL - 15 ))
      if tn_tune $P1 "$OUT/tune_new_verify.meas.json" --kv-dtypes bf16,int8 --untimed-in routes/sm90.yaml; then
        NEW="$OUT/tune_new_verify.meas.json"; tn_replay $NEW
      fi
      BASE=routes/sm90.yaml; [ -n "$NEW" ] && [ -f "$OUT/sm90.yaml" ] && BASE="$OUT/sm90.yaml"
      if tn_tune $(( TOTAL - 15 - (SECONDS - T0) )) "$OUT/tune_new_kv.meas.json" --kv-dtypes fp8,k8v4,rk8v4,nvfp4,rk4v4 \
          --untimed-in "$BASE"; then
        NEW="$NEW $OUT/tune_new_kv.meas.json"; tn_replay $NEW
      fi
      [ -n "$NEW" ] || continue
      python3 -m ninfer_compile.cli tune --sm 90 --replay $NEW --save-measurements "$OUT/tune_new.meas.json" --no-base \
        -o "$OUT/tune_new_only.yaml" --report "$OUT/tune_new_only.md" 2>&1 | tail -n 1 | tee -a "$OUT/tune_new.log"
      echo "tune_new: $(( SECONDS - T0 )) s" | tee -a "$OUT/tune_new.log" ;;
    retune)
      # re-measure some routes (RETUNE_ROUTES, --routes substrings; default the tensor-core GEMVs, e.g.
      # after a kernel change) at RETUNE_T, every candidate, RETUNE_REPS replays, bounded by
      # RETUNE_BUDGET_S; then the committed measurements + these over routes/sm90.yaml -> $OUT/sm90.yaml
      # (the later stages compile with it); $OUT/retune.meas.json is the file to commit
      timeout $(( ${RETUNE_BUDGET_S:-240} + 40 )) python3 -m ninfer_compile.cli tune --sm 90 \
        --families ${RETUNE_FAMILIES:-linear} --routes "${RETUNE_ROUTES:-_gemv_tc}" --t-points ${RETUNE_T:-2,4,8,16,32} \
        --reps ${RETUNE_REPS:-5} --budget-s ${RETUNE_BUDGET_S:-240} --draft-tokens 0 ${RETUNE_CANDIDATES:+--candidates $RETUNE_CANDIDATES} \
        --save-measurements "$OUT/retune.meas.json" 2>&1 | tr '\r' '\n' | grep -v "^ *$" \
        | grep -v "it/s\|run/s\|job/s" > "$OUT/retune.log"
      head -n 3 "$OUT/retune.log" | cut -c1-300; grep "^warning: --budget-s" "$OUT/retune.log" | cut -c1-300
      # RETUNE_OWNS=1 (a run on another card of the same sm, e.g. an H100 over the H200 table): the file is
      # marked "owns_points" (tune --replay then drops older timings at every (op, T) it measured, so each
      # point is picked from timings of one card); its T = 1 point (which the tuner always measures) is
      # dropped unless RETUNE_T names it
      if [ -f "$OUT/retune.meas.json" ] && [ -n "${RETUNE_OWNS:-}" ]; then
        python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['owns_points']=True
if sys.argv[2]=='drop': d['records']=[r for r in d['records'] if r.get('t')!=1]
json.dump(d,open(p,'w'))" "$OUT/retune.meas.json" "$(echo ",${RETUNE_T:-}," | grep -q ",1," && echo keep || echo drop)"
      fi
      [ -f "$OUT/retune.meas.json" ] && replay_committed "$OUT/retune.meas.json" ;;
    tune)
      # every family, format and draft window (~8,000 timings since the verify / KV-format cases): bounded by
      # --budget-s (the cases left out are named in tune.log); tune_new measures only the untimed groups
      timeout 420 python3 -m ninfer_compile.cli tune --sm 90 --budget-s ${TUNE_BUDGET_S:-380} -o "$OUT/sm90.yaml" --report "$OUT/sm90.md" \
        --save-measurements "$OUT/sm90.meas.json" 2>&1 | tail -n 20 | tee "$OUT/tune.log" ;;
    bench)
      timeout 150 python3 bench/bench_linear.py --quick --budget-s 120 --out "$OUT" 2>&1 | tail -n 40 | tee "$OUT/linear.log"
      timeout 90 python3 bench/bench_gdn.py --out "$OUT" 2>&1 | tail -n 20 | tee "$OUT/gdn.log"
      timeout 60 python3 bench/bench_attention.py --out "$OUT" 2>&1 | tail -n 20 | tee "$OUT/attention.log" ;;
    e2e)
      T0=$SECONDS
      ensure_artifact
      ROUTES=""; [ -f "$OUT/sm90.yaml" ] && ROUTES="--routes $OUT/sm90.yaml"
      # E2E_TAG: a suffix for the plan directory and the result label (an A/B in one call, e.g.
      # NINFER_PDL=0 E2E_TAG=-nopdl: the same env reaches the compiler and the runtime);
      # E2E_PROFILE: concurrencies broken down per kernel after the timed runs (default 1; "" = none);
      # E2E_PREFILL / E2E_C: the prefill lengths and decode concurrencies timed
      for kv in ${E2E_KV:-bf16 int8}; do
        python3 -m ninfer_compile.cli "$A" --sm 90 $ROUTES --concurrency 1,2,4,8 --max-context 20480 \
          --kv-dtype "$kv" -o "/tmp/p90_$kv${E2E_TAG:-}" 2>&1 | tail -n 1
        timeout 200 python3 bench/bench_e2e.py --plan "/tmp/p90_$kv${E2E_TAG:-}" --artifact "$A" --out "$OUT" \
          --label "27b-$kv-kv${E2E_TAG:-}" --prefill ${E2E_PREFILL:-1024,4096,16384} --context 4096 --concurrency ${E2E_C:-1,2,4,8} \
          --profile "${E2E_PROFILE-1}" \
          2>&1 | tail -n 70 | tee "$OUT/e2e_$kv${E2E_TAG:-}.log"
      done
      [ "${PEERS:-1}" = 0 ] || run_peers $(( ${E2E_BUDGET_S:-540} - (SECONDS - T0) )) ;;
    spec)
      # SPEC_K: the draft windows (one plan each); SPEC_C: the concurrencies timed; SPEC_FORCED_C: the
      # concurrencies of the forced-acceptance runs; SPEC_BUDGET_S bounds the bench (compiles not included)
      ensure_artifact
      ROUTES=""; [ -f "$OUT/sm90.yaml" ] && ROUTES="--routes $OUT/sm90.yaml"
      PLANS=""
      for k in ${SPEC_K:-1 2 3 4 5}; do
        python3 -m ninfer_compile.cli "$A" --sm 90 $ROUTES --concurrency ${SPEC_C:-1,2,4,8} --max-context 20480 \
          --draft-tokens "$k" -o "/tmp/p90_spec_k$k" 2>&1 | tail -n 1 | tee -a "$OUT/spec_compile.log"
        [ -f "/tmp/p90_spec_k$k/plan.json" ] && PLANS="$PLANS --plan /tmp/p90_spec_k$k"
      done
      [ -n "$PLANS" ] || { echo "spec: no plan compiled (see spec_compile.log)"; continue; }
      # label 27b-k<K list>: SPEC_K="1 2 3" and "4 5" in two calls keep both; bench_spec.py --merge joins them
      timeout ${SPEC_BUDGET_S:-420} python3 bench/bench_spec.py $PLANS --artifact "$A" --out "$OUT" \
        --label "27b-k$(echo ${SPEC_K:-1 2 3 4 5} | tr ' ' '-')" \
        --concurrency ${SPEC_C:-1,2,4,8} --context 4096 --forced-concurrency "${SPEC_FORCED_C-1,8}" --profile "${SPEC_PROFILE:-}" \
        2>&1 | tail -n 90 | tee "$OUT/spec.log" ;;
    kve2e)
      # issue #17 item 2: each KV format end to end on the 27B (one plan per format, C = 1, context room
      # for 32K): bench_e2e at depth 4K (with a 4K prefill) and at 32K, then one table
      # (bench/kv_e2e_table.py); KV_E2E picks the formats (default all seven), KVE2E_BUDGET_S bounds the stage
      ensure_artifact
      T0=$SECONDS
      ROUTES=""; [ -f "$OUT/sm90.yaml" ] && ROUTES="--routes $OUT/sm90.yaml"
      mkdir -p "$OUT/kve2e"
      for kv in ${KV_E2E:-bf16 int8 fp8 k8v4 rk8v4 nvfp4 rk4v4}; do
        left=$(( ${KVE2E_BUDGET_S:-540} - (SECONDS - T0) ))
        [ "$left" -gt 60 ] || { echo "kve2e: budget spent before $kv"; break; }
        python3 -m ninfer_compile.cli "$A" --sm 90 $ROUTES --concurrency 1 --max-context 33792 \
          --kv-dtype "$kv" -o "/tmp/p90_kv_$kv" 2>&1 | tail -n 1
        for depth in 4096 32768; do
          pre=""; [ "$depth" = 4096 ] && pre=4096
          timeout $(( left < 150 ? left : 150 )) python3 bench/bench_e2e.py --plan "/tmp/p90_kv_$kv" --artifact "$A" \
            --out "$OUT/kve2e" --label "27b-$kv-kv-$((depth / 1024))k" --prefill "$pre" --context $depth \
            --concurrency 1 --decode-tokens 32 2>&1 | grep "^decode\|^prefill\|error" | sed "s/^/$kv $depth: /"
        done
      done
      python3 bench/kv_e2e_table.py "$OUT"/kve2e/e2e_27b-*-kv-*k.json --out "$OUT" --label "27b${KVE2E_TAG:-}" | tail -n 12
      tar -C "$OUT" -czf "$OUT/kve2e${KVE2E_TAG:-}_raw.tgz" kve2e && rm -rf "$OUT/kve2e" ;;
    serve)
      # issue #17 item 3 at a 32K shared prefix: ninfer-serve on a plan with room for it (C = 1..8),
      # bench/bench_serve.py (TTFT / per-token at SERVE_C, the prefix cold vs warm, a bounded load run)
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site wheels/serve/*.whl \
        || { echo "error: the server's wheels (fastapi, uvicorn, prometheus-client, ...) belong in wheels/serve (bench/gpu_wheels.sh)"; continue; }
      ensure_artifact
      python3 -m ninfer_compile.cli "$A" --sm 90 --concurrency 1,2,4,8 --max-context ${SERVE_MAX_CONTEXT:-34816} \
        -o /tmp/p90_serve 2>&1 | tail -n 1
      timeout ${SERVE_TIMEOUT_S:-300} python3 bench/bench_serve.py --plan /tmp/p90_serve --artifact "$A" --out "$OUT" \
        --label "27b-prefix${SERVE_PREFIX:-32768}" --concurrency ${SERVE_C:-1,2,4,8} --prefix-tokens ${SERVE_PREFIX:-32768} \
        --load-requests ${SERVE_LOAD:-16} --budget-s $(( ${SERVE_TIMEOUT_S:-300} - 30 )) \
        --server-args "${SERVE_ARGS:---prefix-cache-gib 24}" 2>&1 | tail -n 30 ;;
    peers)
      T0=$SECONDS
      ensure_artifact
      run_peers $(( ${PEERS_BUDGET_S:-540} - (SECONDS - T0) )) ;;
    kv)
      # the KV formats' kernel tests at GPU shapes (the interpreter-sized ones run too, on CUDA), then
      # their benchmark; KV_TESTS_TIMEOUT_S / KV_BENCH_TIMEOUT_S bound each part
      timeout ${KV_TESTS_TIMEOUT_S:-240} python3 -m pytest -q -p no:cacheprovider -rf -n ${GPU_TEST_WORKERS:-8} \
        tests/kernels/kv_cache/test_kv_cache.py tests/kernels/kv_cache/test_formats.py tests/kernels/attention \
        > "$OUT/kv_tests.log" 2>&1; grep -m 5 -n "Error\|FAILED" "$OUT/kv_tests.log"; tail -n 3 "$OUT/kv_tests.log"
      timeout ${KV_BENCH_TIMEOUT_S:-300} python3 bench/bench_kv.py --out "$OUT" 2>&1 | tail -n 80 | tee "$OUT/kv.log" ;;
    *) echo "error: unknown stage $stage (tests | tune | retune | gemv | cliff | bench | e2e | peers | spec | kv | kve2e | serve | tune_new)"; exit 2 ;;
  esac
done
