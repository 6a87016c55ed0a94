"""Per-route table of the linear routes from saved tuner measurements (no GPU needed).

For each qwen3.6-27b linear shape and T: every route's best µs over its measured params, and its
% of a given HBM read bandwidth (weight bytes / µs / BW) for T <= 32, TFLOP/s for T >= 64. Several measurement files merge like
`ninfer-compile tune --replay` (a later file's timing of the same candidate wins).

    python bench/linear_table.py --bw 4.08e12 --t 1,4,16,32,1024 MEAS.json [MEAS2.json ...] > table.md
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ninfer_compile.artifact.formats import row_split_geometry  # noqa: E402
from ninfer_compile.tune.cli import merge_measurements  # noqa: E402

NAMES = {(34816, 5120): "gate_up", (5120, 17408): "down", (12288, 5120): "GDN value_z",
         (4096, 5120): "GDN query_key", (7168, 5120): "attn query_key / gate_value", (5120, 6144): "output",
         (248320, 5120): "head", (5120, 10240): "MTP input", (14336, 5120): "MTP qkgv"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bw", type=float, required=True, help="HBM read bandwidth, bytes/s, for the %% column")
    ap.add_argument("--t", default="1,4,16,32,1024")
    ap.add_argument("--sm", type=int, default=90)
    args = ap.parse_args(argv)
    ts = [int(v) for v in args.t.split(",")]
    saved = merge_measurements(args.files, args.sm)
    best: dict = collections.defaultdict(dict)   # (fmt, n, k, epi) -> {(route, t): us}
    for r in saved["records"]:
        if r.get("family") != "linear" or r.get("us") is None:
            continue
        m = r["match"]
        key = (m["format"], m["n"], m["k"], m.get("epilogue", "none"))
        rk = (r["route"], r["t"])
        best[key][rk] = min(best[key].get(rk, float("inf")), r["us"])
    env = saved.get("environment", {})
    print(f"# Linear routes, µs (best params) and % of {args.bw / 1e12:.2f} TB/s read bandwidth\n")
    print(f"{env.get('device', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}; "
          f"cold weights (copies > 3x L2), CUDA-graph replay, median. Source: {', '.join(map(os.path.basename, args.files))}\n")
    for key in sorted(best, key=lambda k: (k[0] == "W8G32_F16S", k[0] == "BF16", -k[1] * k[2])):
        fmt, n, k, epi = key
        if fmt == "BF16":
            continue
        nbytes = row_split_geometry(fmt, n, k).total
        routes = sorted({rt for rt, _ in best[key]})
        print(f"## {NAMES.get((n, k), '')} {n}x{k} {fmt} epilogue {epi} ({nbytes / 1e6:.1f} MB)\n")
        print("| route | " + " | ".join(f"T={t}" for t in ts) + " |")
        print("|---|" + "---:|" * len(ts))
        for rt in routes:
            cells = []
            for t in ts:
                us = best[key].get((rt, t))
                if us is None:
                    cells.append("")
                elif t >= 64:  # compute-bound: TFLOP/s instead of bandwidth
                    cells.append(f"{us:.1f} ({2.0 * t * n * k / (us * 1e-6) / 1e12:.0f} TF/s)")
                else:
                    cells.append(f"{us:.1f} ({100 * nbytes / (us * 1e-6) / args.bw:.0f}%)")
            print(f"| {rt} | " + " | ".join(cells) + " |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
