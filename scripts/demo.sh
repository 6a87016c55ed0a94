#!/usr/bin/env bash
# Set up (idempotent), then run the main job on the project's trained tiny model: the committed
# Qwen3.5-architecture checkpoint examples/tiny-trained/ (trained on Python standard-library source
# by examples/train_tiny.py; see its MODEL_CARD.md) is packed into a .ninfer artifact, inspected,
# checked against its contract, scored by the float32 reference, compiled for sm 86 and run by the
# runtime (Triton interpreter on the CPU): it writes Python-looking text and scores a text file.
# Everything runs on the CPU; outputs land in ./out/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
OUT=out/quickstart
rm -rf "$OUT" && mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

CKPT=examples/tiny-trained
HELDOUT="$CKPT/heldout.txt"

step "1. the trained tiny checkpoint ($CKPT: 6 layers, hidden 128, byte-level BPE of 2048, one MTP layer)"
grep -m1 -A3 '^## Result' "$CKPT/MODEL_CARD.md" || true

step "2. pack it into a NInfer v1 artifact (default recipe: Q4/Q5/Q6 as for qwen3.6-27b)"
ninfer-compile pack "$CKPT" -o "$OUT/tiny.ninfer" --model-id tiny-quickstart

step "3. inspect the artifact"
ninfer-compile inspect "$OUT/tiny.ninfer" | head -n 12

step "4. check it against its contract (written beside it by pack)"
ninfer-compile check "$OUT/tiny.ninfer"

step "5. float32 reference: perplexity of the first lines of the held-out corpus"
head -n 40 "$HELDOUT" > "$OUT/heldout-head.txt"
ninfer-compile reference "$OUT/tiny.ninfer" --perplexity "$OUT/heldout-head.txt" --ppl-context 256 --quiet

step "6. compile a plan for an RTX 3090 (sm 86) — no GPU needed; --explain shows each op's route"
ninfer-compile "$OUT/tiny.ninfer" --sm 86 --max-context 256 --prefill-chunk 32 --prefill-logits all \
  -o "$OUT/tiny.sm86.plan" --explain > "$OUT/explain.tsv"
head -n 8 "$OUT/explain.tsv"; echo "... ($(wc -l < "$OUT/explain.tsv") lines in $OUT/explain.tsv)"
cat "$OUT/tiny.sm86.plan/memory.txt" | head -n 6

step "7. generate with the runtime (no GPU here: the sm_86 plan's Triton kernels run under the interpreter, slowly)"
ninfer-run "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --prompt "def is_even(n):" --max-new-tokens 12 --greedy

step "8. perplexity with the runtime (the plan was compiled with --prefill-logits all)"
head -n 4 "$HELDOUT" > "$OUT/heldout-4lines.txt"
ninfer-run "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --perplexity "$OUT/heldout-4lines.txt" --quiet
step "9. speculative decoding: a plan with a draft window of 2 (verify + MTP draft extents), the same prompt with --spec mtp"
ninfer-compile "$OUT/tiny.ninfer" --sm 86 --max-context 256 --prefill-chunk 32 --draft-tokens 2 \
  -o "$OUT/tiny.sm86.k2.plan" --quiet
grep -E "MTP KV|verify" "$OUT/tiny.sm86.k2.plan/memory.txt" | head -n 3
ninfer-run "$OUT/tiny.sm86.k2.plan" --artifact "$OUT/tiny.ninfer" --prompt "def is_even(n):" --max-new-tokens 6 \
  --greedy --spec mtp
printf '\ndone: outputs in %s\n' "$OUT"
