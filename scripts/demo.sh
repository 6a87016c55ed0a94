#!/usr/bin/env bash
# Set up (idempotent), then run the main job on the embedded default: a tiny random Qwen3.5
# checkpoint (examples/make_tiny_checkpoint.py) is packed into a .ninfer artifact, inspected,
# checked against its contract, run through the float32 reference model, compiled for sm 86, and
# run by the runtime (Triton interpreter on the CPU).
# Everything runs on the CPU; outputs land in ./out/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
OUT=out/quickstart
rm -rf "$OUT" && mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. a tiny Hugging Face checkpoint (random weights, real tokenizer)"
python examples/make_tiny_checkpoint.py "$OUT/hf" --seed 0 2>&1 | grep -v -e "falling back" -e "Writing model shards"

step "2. pack it into a NInfer v1 artifact (default recipe: Q4/Q5/Q6 as for qwen3.6-27b)"
ninfer-compile pack "$OUT/hf" -o "$OUT/tiny.ninfer" --model-id tiny-quickstart

step "3. inspect the artifact"
ninfer-compile inspect "$OUT/tiny.ninfer"

step "4. check it against its contract (written beside it by pack)"
ninfer-compile check "$OUT/tiny.ninfer"

step "5. float32 reference logits for tokens 1,2,3,4"
ninfer-compile reference "$OUT/tiny.ninfer" --tokens 1,2,3,4 --out "$OUT/logits.npy"
python - "$OUT/logits.npy" <<'PY'
import sys, numpy as np
x = np.load(sys.argv[1]); print(f"logits {x.shape} {x.dtype}; argmax per position: {x.argmax(-1).tolist()}")
PY

step "6. compile a plan for an RTX 3090 (sm 86) — no GPU needed; --explain shows each op's route"
ninfer-compile "$OUT/tiny.ninfer" --sm 86 --concurrency 1,2 --max-context 256 --prefill-chunk 64 \
  -o "$OUT/tiny.sm86.plan" --explain > "$OUT/explain.tsv"
head -n 8 "$OUT/explain.tsv"; echo "... ($(wc -l < "$OUT/explain.tsv") lines in $OUT/explain.tsv)"
cat "$OUT/tiny.sm86.plan/memory.txt" | head -n 6

step "7. generate with the runtime (no GPU here: the sm_86 plan's Triton kernels run under the interpreter, slowly)"
ninfer-run "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --prompt "Hello world" --max-new-tokens 5 --greedy
printf '\ndone: outputs in %s\n' "$OUT"
