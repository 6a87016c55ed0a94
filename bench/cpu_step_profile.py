"""Where one C = 1 decode step of the CPU path goes (issue 28): per family / weight format.

    python bench/cpu_step_profile.py [--layers 24] [--work out/bench_cpu] [--reps 5] [--threads N]

Builds (or reuses, in --work) bench_cpu.py's random Qwen3.5-architecture checkpoint with --layers
layers (24: the ~0.8B one; fewer to iterate), packs it with the default recipe, compiles the plan,
decodes a few tokens (first use: the weight layouts), then times each launch of the decode extent
alone, the best of --reps (wall clock; with --threads 1 the thread's CPU time, which a busy shared
box does not inflate). Prints the generate step, the best whole-step loop over the bound launches,
the sum of the per-launch minima (the difference: time between launches), and the per-group split
with the torch ops each launch dispatches (top-level aten ops under torch.profiler, one run).
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu as bc  # noqa: E402


def group(b) -> str:
    w = b.kwargs.get("weight")
    if b.kind != "linear" or w is None:
        return b.kind
    fmt = getattr(w, "format", None) or str(getattr(w, "dtype", ""))
    rows = getattr(w, "n", None) or w.shape[0]
    return f"linear {fmt}" + (" (head)" if rows >= bc.BIG["vocab_size"] else "")


def aten_ops(b) -> int:
    """The top-level torch ops one launch dispatches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        b()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--work", type=Path, default=bc.REPO / "out" / "bench_cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    import ninfer_runtime as nr

    bc.BIG["num_hidden_layers"] = args.layers
    args.work.mkdir(parents=True, exist_ok=True)
    params = bc.make_big(args.work / "big-hf")
    art = args.work / "big.ninfer"
    if not art.is_file():
        bc.run(bc.BIN / "ninfer-compile", "pack", args.work / "big-hf", "-o", art, "--model-id", "qwen3.5-random-0.8b")
    plan = bc.compile_plan(art, args.work / "big.sm86.plan", "--max-context", "256", "--prefill-chunk", "32",
                           "--concurrency", "1", "--no-binaries")
    with nr.load(plan, art, progress=False) as eng:
        ids = list(range(1000, 1008))
        eng.generate(ids, 2, ignore_eos=True)
        eng.generate(ids, 8, ignore_eos=True)
        st = eng.last_stats
        step = st["decode_s"] / st["decode_tokens"]
        bound = eng.decode_runners[0].bound(None)
        best = [float("inf")] * len(bound)
        loops = []
        for _ in range(args.reps):
            for i, b in enumerate(bound):
                t = clock()
                b()
                best[i] = min(best[i], clock() - t)
            t = clock()
            for b in bound:
                b()
            loops.append(clock() - t)
        ops = [aten_ops(b) for b in bound]
    per = collections.defaultdict(float)
    count = collections.Counter()
    nops = collections.Counter()
    for b, dt, n in zip(bound, best, ops):
        per[group(b)] += dt
        count[group(b)] += 1
        nops[group(b)] += n
    total = sum(per.values())
    print(f"{params / 1e9:.2f}B parameters, {args.layers} layers, torch threads {torch.get_num_threads()}; "
          f"generate step {1000 * step:.1f} ms ({1 / step:.2f} tok/s); best whole-step loop {1000 * min(loops):.1f} ms; "
          f"sum of per-launch minima {1000 * total:.1f} ms over {len(bound)} launches, {sum(ops)} torch ops")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<28} {count[k]:4d} launches {1000 * v:8.2f} ms {100 * v / total:5.1f}%  "
              f"{1e6 * v / count[k]:9.1f} us/launch {nops[k] / count[k]:5.1f} torch ops/launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
