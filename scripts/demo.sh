#!/usr/bin/env bash
# Set up (idempotent), then run the main job on the project's trained tiny model: the committed
# Qwen3.5-architecture checkpoint examples/tiny-trained/ (trained on Python standard-library source
# by examples/train_tiny.py; see its MODEL_CARD.md) is packed into a .ninfer artifact, inspected,
# checked against its contract, scored by the float32 reference, compiled for sm 86 (an RTX 3090;
# no GPU needed) and run by the runtime on the CPU: the plan's launches run through its torch
# implementations (`--kernels torch`, the CPU default); one short generation runs the same plan's
# Triton kernels under Triton's interpreter to show them working. Then speculative decoding and
# one request through `ninfer-serve` with the official `openai` client.
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
SERVE_PID=
stop_server() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill "$SERVE_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVE_PID" 2>/dev/null || true
  fi
}
trap stop_server EXIT

step "1. the trained tiny checkpoint ($CKPT: 6 layers, hidden 128, byte-level BPE of 2048, one MTP layer)"
grep -m1 -A3 '^## Result' "$CKPT/MODEL_CARD.md" || true

step "2. pack it into a NInfer v1 artifact (default recipe: Q4/Q5/Q6 as for qwen3.6-27b)"
ninfer-compile pack "$CKPT" -o "$OUT/tiny.ninfer" --model-id tiny-quickstart

step "3. inspect the artifact"
ninfer-compile inspect "$OUT/tiny.ninfer" | head -n 12

step "4. check it against its contract (written beside it by pack)"
ninfer-compile check "$OUT/tiny.ninfer"

step "5. float32 reference: perplexity of the first lines of the held-out corpus"
head -n 200 "$HELDOUT" > "$OUT/heldout-head.txt"
ninfer-compile reference "$OUT/tiny.ninfer" --perplexity "$OUT/heldout-head.txt" --ppl-context 256 --quiet

step "6. compile a plan for an RTX 3090 (sm 86) — no GPU needed; --explain shows each op's route"
ninfer-compile "$OUT/tiny.ninfer" --sm 86 --max-context 256 --prefill-chunk 64 --prefill-logits all \
  --concurrency 1,2 -o "$OUT/tiny.sm86.plan" --explain > "$OUT/explain.tsv"
head -n 8 "$OUT/explain.tsv"; echo "... ($(wc -l < "$OUT/explain.tsv") lines in $OUT/explain.tsv)"
head -n 6 "$OUT/tiny.sm86.plan/memory.txt"

step "7. generate with the runtime (no GPU here: the plan's torch implementations run on the CPU)"
ninfer-run "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --prompt "def is_even(n):" --max-new-tokens 64 --greedy

step "8. perplexity with the runtime, the same lines as step 5 (the plan was compiled with --prefill-logits all)"
ninfer-run "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --perplexity "$OUT/heldout-head.txt" \
  --ppl-context 256 --quiet

step "9. speculative decoding: a plan with a draft window of 2 (verify + MTP draft extents), the same prompt with --spec mtp"
# source only (--no-binaries): this plan runs here, on the CPU
ninfer-compile "$OUT/tiny.ninfer" --sm 86 --max-context 256 --prefill-chunk 64 --draft-tokens 2 \
  -o "$OUT/tiny.sm86.k2.plan" --no-binaries --quiet
grep -E "MTP KV|verify" "$OUT/tiny.sm86.k2.plan/memory.txt" | head -n 3
ninfer-run "$OUT/tiny.sm86.k2.plan" --artifact "$OUT/tiny.ninfer" --prompt "def is_even(n):" --max-new-tokens 64 \
  --greedy --spec mtp

step "10. serve it: ninfer-serve on 127.0.0.1 (a free port), one request with the official openai client"
PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ninfer-serve "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --host 127.0.0.1 --port "$PORT" \
  --log-file "$OUT/serve.log" 2> "$OUT/serve.err" &
SERVE_PID=$!
python - "$PORT" <<'EOF'
import sys, time

import httpx
import openai

url = f"http://127.0.0.1:{sys.argv[1]}"
t0 = time.monotonic()
while True:  # bounded wait for the server
    try:
        if httpx.get(url + "/health", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() - t0 > 90:
        sys.exit("ninfer-serve did not answer /health within 90 s (see out/quickstart/serve.err)")
    time.sleep(0.2)
client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
model = client.models.list().data[0].id
t0 = time.perf_counter()
first, n, text = None, 0, []
for chunk in client.completions.create(model=model, prompt="def is_even(n):", max_tokens=48, temperature=0,
                                       stream=True):
    if chunk.choices and chunk.choices[0].text:
        first = first or time.perf_counter()
        n += 1
        text.append(chunk.choices[0].text)
end = time.perf_counter()
print("".join(text))
print(f"openai client, model {model!r}: first token {1000 * (first - t0):.0f} ms, {n} chunks streamed, "
      f"{(n - 1) / max(end - first, 1e-9):.1f} tok/s")
EOF
stop_server
head -n 1 "$OUT/serve.err"

step "11. the same plan's Triton kernels, under Triton's interpreter (slow: it shows the kernels run; a GPU runs them compiled)"
ninfer-run "$OUT/tiny.sm86.plan" --artifact "$OUT/tiny.ninfer" --prompt "def is_even(n):" --max-new-tokens 3 --greedy \
  --kernels interpret
printf '\ndone: outputs in %s\n' "$OUT"
