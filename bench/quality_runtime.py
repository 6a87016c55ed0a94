"""MTP acceptance through the runtime on the trained tiny model (bench/quality.py --runtime-acceptance).

Protocol (fixed, so later rows compare): the quality corpus (examples/tiny-trained/heldout.txt,
the checkpoint's tokenizer, no special tokens), packed with the bf16 recipe (the reference's
bf16 rows); `--runtime-prompts` slices of `--runtime-prompt-tokens` tokens at evenly spaced offsets
(slice i starts at i x len(corpus) / prompts); for each K a plan compiled with --draft-tokens K
(slots = prompts, prefill chunk 16 (32 when the verify T needs it), context 128; the full output head as
draft head: the HF pack has no shortlist), the slices prefilled into one slot each
(`prefill_lane`: target + MTP prefill chunks), then `spec_round` for all slots together until each
slot generated `--runtime-tokens` greedy tokens. Per round and slot: L = accepted drafts (0..K).
A plan of window K also gives every K' < K: the drafts do not depend on K (each is the MTP chain's
next greedy token), so min(L, K') is what a K'-round at the same position accepts (the reference's
derivation, ninfer_compile/reference/acceptance.py).
The reference at the same rounds: `mtp_acceptance` (float32) over slice + generated tokens, a round
at every position; the runtime round whose t0 sits at position p is the reference's round at
t = p - 1 (its bonus token g0 is t0). Reported: acceptance and tokens per round per K' for both,
and the fraction of rounds where the two L agree (bf16 activations against float32: near-ties may
differ). CPU: under the Triton interpreter (seconds per extent run); GPU: the device's sm.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTEXT = 128


def _compile(art: Path, d: Path, k: int, slots: int, gpu_sm: int | None) -> Path:
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    chunk = 16 if slots * (k + 1) <= 16 else 32
    opts = LowerOptions(prefill_chunk=chunk, concurrency=(slots,), max_context=CONTEXT, draft_tokens=k)
    from bench_spec import interp_spec_table

    # the same small-block table on both devices (the shipped sm90 tiles are sized for the 27B), so a
    # GPU run compares with the CPU's rounds plan for plan
    table = interp_spec_table(d / "interp90.yaml")
    if gpu_sm is None:
        c = compile_artifact(art, 90, routes=table, opts=opts, binaries=False)
    else:
        c = compile_artifact(art, gpu_sm, routes=table, opts=opts)
    plan = d / f"tiny-trained-bf16-k{k}.plan"
    write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    return plan


def run_rounds(engine, prompts: list[list[int]], new_tokens: int) -> list[dict]:
    """Greedy MTP rounds for every prompt together; per slot its generated tokens and rounds
    [(t0 position, accepted)]."""
    from ninfer_runtime.speculative.rounds import Lane, prefill_lane, spec_round

    lanes, out = [], []
    for i, p in enumerate(prompts):
        lane = Lane(i, None, None)
        _, first = prefill_lane(engine, lane, p)
        lanes.append(lane)
        out.append({"prompt": p, "tokens": [first], "rounds": []})
    K = engine.draft_tokens
    active = list(range(len(prompts)))
    while active:
        ls = [lanes[i] for i in active]
        pos = [l.position for l in ls]
        acc0 = [l.accepted for l in ls]
        emitted = spec_round(engine, ls, use_graphs=True)
        still = []
        for i, l, p, a0, em in zip(active, ls, pos, acc0, emitted):
            if l.last_step == "verify":
                out[i]["rounds"].append((p, l.accepted - a0))
            out[i]["tokens"] += em
            if len(out[i]["tokens"]) < new_tokens and l.position + K + 1 < engine.max_context:
                still.append(i)
        active = still
    return out


def compare(model, per_slot: list[dict], k: int) -> tuple[list[int], list[int], int]:
    """(runtime L per round, the reference's L at the same rounds, how many agree). The runtime round
    whose t0 sits at position p is the reference's round at t = p - 1 (`mtp_acceptance`, a round at
    every position of slice + generated tokens)."""
    from ninfer_compile.reference.acceptance import mtp_acceptance

    rt_runs, ref_runs, agree = [], [], 0
    for s in per_slot:
        text = s["prompt"] + s["tokens"]
        start = len(s["prompt"]) - 1
        ref = mtp_acceptance(model, text, k_max=k, every=1, start=start)
        for p, L in s["rounds"]:
            i = (p - 1) - start
            if 0 <= i < len(ref.accepted_runs):
                rt_runs.append(L)
                ref_runs.append(ref.accepted_runs[i])
                agree += int(ref.accepted_runs[i] == L)
    return rt_runs, ref_runs, agree


def _table(runs: list[int], k_max: int) -> list[dict]:
    n = max(1, len(runs))
    return [{"k": k, "acceptance": sum(min(L, k) for L in runs) / n / k, "tokens_per_round": 1 + sum(min(L, k)
             for L in runs) / n} for k in range(1, k_max + 1)]


def main(out_path: Path, ks: list[int], n_prompts: int, prompt_tokens: int, new_tokens: int) -> dict:
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from quality import support as S

    import ninfer_runtime

    gpu_sm = None
    if torch.cuda.is_available():
        maj, mnr = torch.cuda.get_device_capability()
        gpu_sm = maj * 10 + mnr
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    ids = S.heldout_ids()
    step = len(ids) // n_prompts
    prompts = [ids[i * step:i * step + prompt_tokens] for i in range(n_prompts)]
    res = {"corpus": "examples/tiny-trained/heldout.txt", "recipe": "bf16", "prompts": n_prompts,
           "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "offsets": [i * step for i in range(n_prompts)],
           "context": CONTEXT, "device": torch.cuda.get_device_name() if gpu_sm else "CPU (Triton interpreter)",
           "python": platform.python_version(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "plans": {}}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        art = S.pack(d / "tiny-trained-bf16.ninfer", "bf16")
        model = S.reference_model(art)
        for k in ks:
            t0 = time.perf_counter()
            plan = _compile(art, d, k, n_prompts, gpu_sm)
            eng = ninfer_runtime.load(plan, art, progress=False)
            try:
                per_slot = run_rounds(eng, prompts, new_tokens)
            finally:
                eng.close()
            rt_runs, ref_runs, agree = compare(model, per_slot, k)
            row = {"k": k, "rounds": len(rt_runs), "runtime": _table(rt_runs, k), "reference": _table(ref_runs, k),
                   "agree": agree / max(1, len(rt_runs)), "runtime_runs": rt_runs, "reference_runs": ref_runs,
                   "generated": [s["tokens"] for s in per_slot], "seconds": round(time.perf_counter() - t0, 1)}
            res["plans"][k] = row
            print(f"K={k}: {len(rt_runs)} rounds, runtime {[round(r['acceptance'], 3) for r in row['runtime']]}, "
                  f"reference {[round(r['acceptance'], 3) for r in row['reference']]}, agree {row['agree']:.0%} "
                  f"({row['seconds']} s)", file=sys.stderr, flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(res, indent=1) + "\n")  # after every plan: a long run keeps its rows
    print(render_md(res))
    return res


def render_md(res: dict) -> str:
    """The bench/quality.md table: per plan K and derived K' <= K, runtime vs reference acceptance and
    tokens per round at the same rounds."""
    lines = [f"{res['device']}, {res['date']}: {res['prompts']} slices x {res['prompt_tokens']} tokens (offsets "
             f"{res['offsets']}), {res['new_tokens']} greedy tokens each, recipe {res['recipe']}", "",
             "| plan K | K | rounds | runtime acceptance | runtime tokens/round | reference acceptance (same rounds) | "
             "reference tokens/round | rounds with equal L |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k, row in sorted(res["plans"].items(), key=lambda kv: int(kv[0])):
        for rt, ref in zip(row["runtime"], row["reference"]):
            lines.append(f"| {k} | {rt['k']} | {row['rounds']} | {100 * rt['acceptance']:.1f}% | "
                         f"{rt['tokens_per_round']:.3f} | {100 * ref['acceptance']:.1f}% | "
                         f"{ref['tokens_per_round']:.3f} | "
                         f"{100 * row['agree']:.0f}% |")
    return "\n".join(lines) + "\n"
