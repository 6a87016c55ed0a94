"""The quality table of bench/quality.md: perplexity per recipe on the fixed quality corpus and
the MTP head's greedy acceptance, for the committed trained tiny model (examples/tiny-trained/).

    python bench/quality.py [--out bench/results/quality_tiny-trained.json] [--acceptance-tokens 2000]
    python bench/quality.py --runtime-acceptance [--runtime-k 5] [--runtime-prompts 2] [--runtime-tokens 32]
        [--out bench/results/quality_tiny-trained_runtime-acceptance.json]

CPU only (the float32 reference and HF transformers; no plan, no GPU). Protocol (fixed, so rows
added later compare): the corpus is examples/tiny-trained/heldout.txt, tokenized with the
checkpoint's tokenizer, no special tokens; sliding windows of CONTEXT tokens, stride STRIDE (every
scored token after the first window sees >= CONTEXT - STRIDE tokens); MTP acceptance from
ninfer_compile.reference.acceptance over the first --acceptance-tokens tokens, a round every
EVERY tokens, K = 1..5.

`--runtime-acceptance` (bench/quality_runtime.py): MTP acceptance THROUGH THE RUNTIME (a plan compiled
with --draft-tokens K, its mtp_* extents drafting, the verify extent accepting) on greedy continuations
of fixed corpus slices, beside the reference's acceptance at the same round positions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

CONTEXT, STRIDE, EVERY = 512, 384, 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "quality_tiny-trained.json")
    ap.add_argument("--acceptance-tokens", type=int, default=2000)
    ap.add_argument("--runtime-acceptance", action="store_true",
                    help="only the runtime's MTP acceptance (bench/quality_runtime.py) and the reference at the same rounds")
    ap.add_argument("--runtime-k", default="5", help="draft windows to compile and run (comma separated)")
    ap.add_argument("--runtime-prompts", type=int, default=2, help="corpus slices (one slot each, decoded together)")
    ap.add_argument("--runtime-prompt-tokens", type=int, default=48)
    ap.add_argument("--runtime-tokens", type=int, default=32, help="greedy tokens generated per slice")
    ap.add_argument("--reference-tokens", type=int, default=0,
                    help="score only the corpus's first N tokens with the reference (0: all; the reference's "
                         "per-token GDN loop makes the full corpus take minutes per recipe on 2 cores)")
    args = ap.parse_args()
    if args.runtime_acceptance:
        from quality_runtime import main as runtime_main

        out = args.out if args.out != ap.get_default("out") else \
            REPO / "bench" / "results" / "quality_tiny-trained_runtime-acceptance.json"
        runtime_main(out, [int(k) for k in args.runtime_k.split(",") if k], args.runtime_prompts,
                     args.runtime_prompt_tokens, args.runtime_tokens)
        return

    import torch

    from ninfer_runtime.perplexity import perplexity_of_ids
    from quality import support as S
    from ninfer_compile.reference.acceptance import mtp_acceptance

    torch.set_num_threads(2)
    torch.set_flush_denormal(True)  # GDN decays reach subnormal floats; on the CPU they are ~100x slower
    ids = S.heldout_ids()
    out = {"corpus": "examples/tiny-trained/heldout.txt",
           "corpus_sha256": hashlib.sha256(S.HELDOUT.read_bytes()).hexdigest(), "tokens": len(ids),
           "context": CONTEXT, "stride": STRIDE, "python": platform.python_version(), "torch": torch.__version__,
           "rows": {}}

    def timed(name, fn):
        t = time.perf_counter()
        v = fn()
        print(f"{name}: {v} ({time.perf_counter() - t:.0f}s)", file=sys.stderr)
        return v

    hf = timed("hf", lambda: perplexity_of_ids(S.hf_scorer(S.hf_model()), ids, CONTEXT, STRIDE, progress=True))
    out["rows"]["hf_bf16_weights"] = {"perplexity": hf.perplexity, "scored": hf.scored}
    with tempfile.TemporaryDirectory() as d:
        arts = {r: S.pack(Path(d) / f"tiny-{r}.ninfer", r) for r in ("bf16", "default")}
        ref_ids = ids[:args.reference_tokens] if args.reference_tokens else ids
        out["reference_tokens"] = len(ref_ids)
        if len(ref_ids) < len(ids):  # HF on the same prefix, so the rows compare
            hf_p = perplexity_of_ids(S.hf_scorer(S.hf_model()), ref_ids, CONTEXT, STRIDE)
            out["rows"]["hf_bf16_weights_prefix"] = {"perplexity": hf_p.perplexity, "scored": hf_p.scored}
        for r, art in arts.items():
            model = S.reference_model(art)

            def score(tokens, model=model):
                with torch.no_grad():
                    return model.prefill(list(tokens))

            res = timed(f"reference {r}", lambda: perplexity_of_ids(score, ref_ids, CONTEXT, STRIDE, progress=True))
            out["rows"][f"reference_{r}"] = {"perplexity": res.perplexity, "scored": res.scored}
        acc_ids = ids[:args.acceptance_tokens]
        for r, art in arts.items():
            acc = timed(f"acceptance {r}", lambda: mtp_acceptance(S.reference_model(art), acc_ids, k_max=5,
                                                                   every=EVERY, start=16))
            out[f"mtp_acceptance_{r}"] = {"tokens": len(acc_ids), "every": EVERY, "rounds": acc.rounds,
                                          "table": acc.table(),
                                          "accepted_histogram": [acc.accepted_runs.count(i) for i in range(6)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
