# Sourced by the bench/gpu_call_*.sh scripts (one device call each): the shared start and end.
#   gpu_call_start [WHEEL ...]  $OUT created; the carried wheels (wheels/*.whl and any extra given)
#                               installed into /tmp/site; PYTHONPATH set for this tree; `stamp MSG`
#                               logs a timed line to $OUT/call.log
#   gpu_call_pack               everything under $OUT but call.log and gpu_tests.log into results.tgz
#                               (the device tool returns a few files only)
OUT=${OUT:-out/gpu}
stamp() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/call.log"; }
gpu_call_start() {
  mkdir -p "$OUT"
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site wheels/*.whl "$@" || exit 2
  export PYTHONPATH=/tmp/site:$PWD:$PWD/runtime PYTHONUNBUFFERED=1
}
gpu_call_pack() {
  stamp "packing"
  tar -C "$OUT" -czf /tmp/results.tgz --exclude call.log --exclude gpu_tests.log . && mv /tmp/results.tgz "$OUT/results.tgz"
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name call.log ! -name gpu_tests.log ! -name results.tgz -exec rm -rf {} +
  stamp done
}
