"""The linear family's few-column CPU products per weight format (issue 28): the fused C++ kernel
(`linear/torch_fused.py`) beside torch's int4 / int8 matmuls (`linear/torch_packed.py`), in
G weights/s, over copies of one weight shape of the ~0.8B model totalling ~200 MB (beyond the L3,
so the planes stream from memory like a decode step's).

    python bench/cpu_fused_dot.py [--threads 1 2] [--columns 1 2 4]

With 1 thread the thread's CPU time is the clock (a busy shared box does not inflate it), with
more the wall clock (best of 5). Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels" / "linear"))
from _linear_helpers import random_weight  # noqa: E402

from ninfer_compile.kernels.linear import torch_fused, torch_packed  # noqa: E402
from ninfer_compile.kernels.linear.weights import QuantWeight  # noqa: E402

SHAPES = [("Q4G64_F16S", 7168, 1024), ("Q5G64_F16S", 1024, 3584), ("Q5G64_F16S", 4096, 1024),
          ("Q6G64_F16S", 248320, 1024)]


def best(fn, reps: int, clock) -> float:
    fn()
    b = float("inf")
    for _ in range(reps):
        t0 = clock()
        fn()
        b = min(b, clock() - t0)
    return b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--columns", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--total-mb", type=float, default=200)
    args = ap.parse_args(argv)
    if torch_fused.kernel() is None:
        raise SystemExit("cpu_fused_dot: the fused kernel does not build or run here")
    gen = torch.Generator().manual_seed(0)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for fmt, n, k in SHAPES:
        w0 = random_weight(fmt, n, k, gen)
        copies = max(1, int(args.total_mb * 1e6 // w0.nbytes))
        ws = [w0] + [QuantWeight(fmt, n, k, w0.k_pad, w0.groups_per_row, w0.base.clone(),
                                 None if w0.high is None else w0.high.clone(), w0.scale.clone())
                     for _ in range(copies - 1)]
        for t in args.columns:
            x = torch.randn(t, k, generator=gen).bfloat16()
            cells = []
            for thr in args.threads:
                torch.set_num_threads(thr)
                clock = time.thread_time if thr == 1 else time.perf_counter
                tf = best(lambda: [torch_fused.fused_matmul(x, w) for w in ws], 5, clock)
                tn = best(lambda: [torch_packed.packed_matmul(x, w) for w in ws], 3, clock)
                cells.append(f"{thr} thread(s): fused {copies * n * k / tf / 1e9:5.1f}, "
                             f"native {copies * n * k / tn / 1e9:5.1f} G weights/s")
            print(f"{fmt} [{n}, {k}] x{copies} T={t}: " + " | ".join(cells) +
                  f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
