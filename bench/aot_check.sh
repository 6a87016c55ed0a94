#!/usr/bin/env bash
# Ahead-of-time kernel binaries on the GPU machine (its Triton): a tiny plan compiled with and
# without binaries, each loaded by the runtime in a fresh process with an empty Triton cache
# (with binaries: every kernel loads from the plan, nothing is JIT-compiled), then the 27B plan with
# binaries: load time split and time to the first token through ninfer-run. Results -> $OUT.
#   bash bench/aot_check.sh            (wheels carried; see gpu_session.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD:$PWD/runtime PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
W=$(mktemp -d); A=$W/tiny.ninfer; O="--sm 90 --prefill-chunk 64 --concurrency 1,2 --max-context 256"
python3 -m ninfer_compile.cli pack --synthetic tiny-qwen3.5 -o $A 2>&1 | tail -n 1
python3 -m ninfer_compile.cli $A $O -o $W/aot.plan 2>&1 | tail -n 2
python3 -m ninfer_compile.cli $A $O -o $W/jit.plan --no-binaries 2>&1 | tail -n 1
cat > $W/check.py <<'PY'
import glob, json, os, sys, time
import ninfer_runtime as nr
from ninfer_runtime import triton_cache as tc
plan, art = sys.argv[1:3]
print("plan binaries:", json.load(open(plan + "/kernels/manifest.json"))["binaries"].get("status"))
eng = nr.load(plan, art, progress=False)
print(eng.device_note); print("load", {k: round(v, 2) for k, v in eng.load_times.items()})
t = time.perf_counter(); r = eng.generate([5, 77, 201, 12, 9], 16, ignore_eos=True)
print("first generate", round(time.perf_counter() - t, 3), "s")
c = os.environ["TRITON_CACHE_DIR"]; f = [p for p in glob.glob(c + "/**/*", recursive=True) if os.path.isfile(p)]
k = [p for p in f if p.endswith((".cubin", ".ptx", ".ttir", ".ttgir", ".llir", ".source"))]
print("lookups", tc.STATS, "| kernel compiles in user cache:", len(k), "| launcher stubs/other:", len(f) - len(k))
PY
echo "== tiny, with binaries"; TRITON_CACHE_DIR=$W/cache-aot python3 $W/check.py $W/aot.plan $A 2>&1 | tail -n 6
echo "== tiny, source only"; TRITON_CACHE_DIR=$W/cache-jit python3 $W/check.py $W/jit.plan $A 2>&1 | tail -n 6
if [ "${BIG:-1}" = 1 ]; then
  B=/tmp/q27.ninfer
  [ -f $B ] || python3 -m ninfer_compile.cli pack --synthetic qwen3.6-27b -o $B --seed 0 2>&1 | tr '\r' '\n' | tail -n 1
  T0=$SECONDS
  python3 -m ninfer_compile.cli $B --sm 90 --concurrency 1,2,4,8 --max-context 20480 -o $W/p27 2>&1 | tail -n 2
  echo "27B compile incl. binaries: $((SECONDS - T0)) s"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  echo "== 27B, with binaries, empty Triton cache"
  T0=$SECONDS
  TRITON_CACHE_DIR=$W/cache-27 timeout 200 python3 -m ninfer_runtime.cli $W/p27 --artifact $B --tokens 1,2,3 \
    --max-new-tokens 8 --ignore-eos 2>&1 | tr '\r' '\n' | grep -v "^ *$" | tail -n 8
  echo "27B process start to last token: $((SECONDS - T0)) s"
fi
