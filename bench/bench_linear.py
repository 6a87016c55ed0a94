"""Linear-route benchmark on the GPU at the qwen3.6-27b shapes (DESIGN §10).

For every route (inside its declared domain) x shape x T: median µs per call over CUDA-graph
replays with cold weights (launches rotate over enough weight copies to exceed L2), % of the HBM
read roofline measured in the same run, TFLOP/s; beside it, in the same run, bf16 cuBLAS
(`x @ W.t()`), torch's int4 path (`torch._weight_int4pack_mm`, group 128) and gemlite A16W4 G64
(bench/peers_gemlite.py) when available; last a table of cost(T) / cost(1) per shape for the
`--new` routes and the best other route, beside the streaming-read floor and the peers.
Weights are random planes: speed does not depend on weight values.

    PYTHONPATH=. python bench/bench_linear.py --out DIR [--quick] [--shapes gate_up,down] [--t 1,4,16]
        [--new gemm_tc] [--routes gemm_tc,gemv_tc,small_t_mma] [--max-candidates N] [--budget-s S]

Writes DIR/bench_linear.json and DIR/bench_linear.md (with provenance) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ninfer_compile.artifact.formats import row_split_geometry  # noqa: E402
from ninfer_compile.kernels.linear.routes import linear_workspace_numel  # noqa: E402
from ninfer_compile.kernels.linear.weights import from_payload  # noqa: E402
from ninfer_compile.kernels.registry import load_callable, routes_for  # noqa: E402
from ninfer_compile.tune.measure import param_candidates  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers_gemlite import gemlite_layers  # noqa: E402

SHAPES = {  # name: (format, N, K, epilogue)
    "gate_up": ("Q4G64_F16S", 34816, 5120, "swiglu"),
    "down": ("Q5G64_F16S", 5120, 17408, "residual"),
    "value_z": ("Q5G64_F16S", 12288, 5120, "none"),
    "query_key_gdn": ("Q4G64_F16S", 4096, 5120, "none"),
    "query_key_attn": ("Q4G64_F16S", 7168, 5120, "none"),
    "output": ("Q5G64_F16S", 5120, 6144, "residual"),
    "head": ("Q6G64_F16S", 248320, 5120, "none"),
    # the MTP layer's W8 G32 projections
    "mtp_input": ("W8G32_F16S", 5120, 10240, "none"),
    "mtp_qkgv": ("W8G32_F16S", 14336, 5120, "none"),
    "mtp_o": ("W8G32_F16S", 5120, 6144, "residual"),
    "mtp_gate_up": ("W8G32_F16S", 34816, 5120, "swiglu"),
    "mtp_down": ("W8G32_F16S", 5120, 17408, "residual"),
}
LARGE = "gate_up,down,value_z,head"
PREFIX = {"Q4G64_F16S": "q4", "Q5G64_F16S": "q5", "Q6G64_F16S": "q6", "W8G32_F16S": "w8"}
T_ALL = [1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 64, 128, 512, 1024, 4096]
T_QUICK = [1, 4, 16, 32, 1024]
T_MULTI = [1, 2, 3, 4, 5, 8, 12, 16, 17, 24, 32, 48, 64]   # issue 29: decode, verify rounds, concurrent steps
L2_BYTES = 50 * 2**20
COLD_BYTES = 3 * L2_BYTES

# per-route launch params tried (the best is reported; all are recorded)
CANDIDATES = {
    "gemv_fast": [{"BLOCK_N": 16, "BLOCK_K": 1024, "num_warps": 4},
                  {"BLOCK_N": 8, "BLOCK_K": 1024, "num_warps": 4},
                  {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 4},
                  {"BLOCK_N": 32, "BLOCK_K": 512, "num_warps": 8},
                  {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 2},
                  {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4},
                  {"BLOCK_N": 16, "BLOCK_K": 1024, "num_warps": 4, "USE_ASM": False},
                  {"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4, "USE_ASM": False}],
    "gemv": [{"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4},
             {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4},
             {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4},
             {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4}],
    "small_t_mma": [{"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "USE_ASM": "auto"},
                    {"BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "USE_ASM": "auto"},
                    {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "USE_ASM": "auto"},
                    {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "USE_ASM": False}],
    "wide_mma": [{"BLOCK_N": 128, "BLOCK_T": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
                 {"BLOCK_N": 128, "BLOCK_T": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
                 {"BLOCK_N": 256, "BLOCK_T": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}],
}


def provenance() -> dict:
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # pragma: no cover
        drv = f"unavailable: {exc}"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
        "nvidia_smi": drv, "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "command": " ".join(sys.argv),
    }


def random_quant(fmt, n, k, device="cuda"):
    geom = row_split_geometry(fmt, n, k)
    buf = torch.randint(0, 256, (geom.total,), dtype=torch.uint8, device=device)
    sc = (torch.rand(n * geom.groups_per_row, device=device) * 0.02 + 1e-3).half()
    buf[geom.scale_offset:geom.scale_offset + geom.scale_bytes] = sc.view(torch.uint8)
    return from_payload(fmt, (n, k), buf)


_REPS = 20


def time_graph(fns, reps=None):
    """Median µs per launch: capture `fns` (one launch each) into a CUDA graph, replay."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps or _REPS):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0 / len(fns))
    times.sort()
    del g
    return times[len(times) // 2]


def measure_bandwidth():
    n = 2 * 2**30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    a64, b64 = a.view(torch.int64), b.view(torch.int64)
    us = time_graph([lambda: b64.copy_(a64)] * 4, reps=10)
    copy_bw = 2 * n / (us * 1e-6)
    del a, b
    return copy_bw


def n_copies(nbytes):
    return max(2, math.ceil(COLD_BYTES / max(nbytes, 1)))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="T in %s only, one param set per route" % T_QUICK)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--t", default=None, help="comma-separated T values")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--gemv-only", action="store_true",
                    help="only the decode GEMV routes (*_gemv*, T <= 4), with the GEMV optimisation sweep; peers kept")
    ap.add_argument("--routes", default=None,
                    help="comma-separated substrings; only routes whose name contains one (e.g. lowreg,packed)")
    ap.add_argument("--max-candidates", type=int, default=99, help="param sets tried per route (best reported)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new rows after this")
    ap.add_argument("--new", default="gemm_tc", help="route-name substring of the routes under test (ratio table)")
    ap.add_argument("--table", default=None,
                    help="route table (routes/sm90.yaml): the other routes are only its selection at each op and T "
                         "(the current best, with its params), beside the --new routes' sweep")
    ap.add_argument("--gemlite-t", default=None, help="T values timed for gemlite (its autotune costs seconds per "
                    "new T); default: every T")
    ap.add_argument("--ratios", default=None, metavar="JSON",
                    help="print the cost(T)/cost(1) table of a finished (or cut) run's bench_linear.json and exit")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per timing (median)")
    args = ap.parse_args(argv)
    if args.ratios:
        with open(args.ratios) as f:
            run = json.load(f)
        print("\n".join(ratio_table(run["rows"], run["read_bw"], args.new)))
        return 0
    bad = [s for s in args.shapes.split(",") if s not in SHAPES]
    if bad:
        print(f"bench_linear: unknown shape(s) {bad} in --shapes (known: {', '.join(SHAPES)})")
        return 2
    if not torch.cuda.is_available():
        print("bench_linear: needs a CUDA GPU (run it on the GPU machine); nothing measured")
        return 2
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    torch.manual_seed(0)
    prov = provenance()
    copy_bw = measure_bandwidth()
    t_list = [int(v) for v in args.t.split(",")] if args.t else (T_QUICK if args.quick else T_ALL)
    global _REPS
    _REPS = args.reps
    table = None
    if args.table:
        from ninfer_compile.routes.table import load_table
        table = load_table(args.table)
    rows = []
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from limits import streaming_read_gbs

    stream_bw = streaming_read_gbs(torch)["gbs"] * 1e9
    read_bw = max(copy_bw, stream_bw)
    print(f"# {prov['gpu']} torch {prov['torch']} triton {prov['triton']}; device copy {copy_bw / 1e12:.2f} TB/s (r+w), "
          f"streaming read {stream_bw / 1e12:.2f} TB/s", flush=True)

    def emit(row):
        rows.append(row)
        with open(os.path.join(args.out, "bench_linear.json"), "w") as f:
            json.dump({"provenance": prov, "copy_bw": copy_bw, "read_bw": read_bw, "rows": rows}, f, indent=1)

    for shape in args.shapes.split(","):
        fmt, n, k, epi = SHAPES[shape]
        n_out = n // 2 if epi == "swiglu" else n
        w0 = random_quant(fmt, n, k)
        copies = [w0] + [random_quant(fmt, n, k) for _ in range(n_copies(w0.nbytes) - 1)]
        wbytes = w0.nbytes
        wbf = None
        if not args.no_peers:
            nb = n_copies(n * k * 2)
            wbf = [torch.randn(n, k, device="cuda").bfloat16() for _ in range(min(nb, 4))]
            int4 = None
            try:  # torch int4 path, group 128 (availability differs across torch versions)
                wq = torch.randint(0, 16, (n, k // 2), dtype=torch.uint8, device="cuda")
                packed = torch._convert_weight_to_int4pack(wq, 8)
                sz = torch.randn(k // 128, n, 2, device="cuda").bfloat16()
                int4 = (packed, sz)
            except Exception as exc:
                print(f"  torch int4 unavailable: {type(exc).__name__}: {exc}", flush=True)
            gl = None
            if fmt != "W8G32_F16S":
                gl, why = gemlite_layers(n, k, min(n_copies(n * k // 2), 4))
                if gl is None:
                    print(f"  {why}", flush=True)
        for t in t_list:
            if time.time() - t_start > args.budget_s:
                break
            x = torch.randn(t, k, device="cuda").bfloat16()
            out = torch.empty(t, n_out, dtype=torch.bfloat16, device="cuda")
            res = torch.randn(t, n_out, device="cuda").bfloat16() if epi == "residual" else None
            flops = 2.0 * t * n * k
            peer = {}
            if wbf is not None:
                ob = torch.empty(t, n, dtype=torch.bfloat16, device="cuda")
                try:
                    us = time_graph([lambda w=w: torch.matmul(x, w.t(), out=ob) for w in wbf] * 2)
                    peer["cublas_bf16_us"] = us
                    if t == 1 and shape == "gate_up":
                        read_bw = max(read_bw, n * k * 2 / (us * 1e-6))
                except Exception as exc:
                    peer["cublas_bf16_error"] = str(exc)[:200]
                if gl is not None and (args.gemlite_t is None or str(t) in args.gemlite_t.split(",")):
                    try:
                        peer["gemlite_us"] = time_graph([lambda g=g: g(x) for g in gl] * 2)
                    except Exception as exc:
                        peer["gemlite_error"] = str(exc)[:200]
                if int4 is not None:
                    try:
                        peer["torch_int4_us"] = time_graph(
                            [lambda: torch._weight_int4pack_mm(x, int4[0], 128, int4[1])] * 4)
                    except Exception as exc:
                        peer["torch_int4_error"] = str(exc)[:200]
            table_pick = None
            if table is not None:  # the current best: the route table's selection at this op and T
                try:
                    sel = table.select("linear", t, {"format": fmt, "n": n, "k": k, "epilogue": epi})
                    table_pick = (sel.route.name, dict(sel.params))
                except Exception as exc:  # no row covers it: only the new routes are timed
                    print(f"  {shape} T={t}: the table has no pick ({type(exc).__name__}: {exc})", flush=True)
                    table_pick = ("", {})
            for route in routes_for("linear"):
                name = route.name
                if not name.startswith(PREFIX[fmt] + "_"):
                    continue
                if table_pick is not None and name != table_pick[0] and args.new not in name:
                    continue
                if args.routes and not any(f in name for f in args.routes.split(",")) \
                        and not (table_pick and name == table_pick[0]):
                    continue
                dom = route.domain
                if t < dom.min_t or (dom.max_t is not None and t > dom.max_t):
                    continue
                kind = name.split("_", 1)[1]
                if args.gemv_only and not kind.startswith("gemv"):
                    continue
                if args.gemv_only and kind == "gemv":
                    kind = "gemv_fast" if fmt == "Q4G64_F16S" else "gemv"
                if kind == "wide_mma" and t < 16:
                    continue
                if table_pick is not None and name == table_pick[0] and args.new not in name:
                    cands = [table_pick[1]]
                elif kind in CANDIDATES:
                    cands = CANDIDATES[kind][:2] if args.quick else CANDIDATES[kind][:args.max_candidates]
                else:  # routes without a bench sweep: the tuner's curated param sets
                    cands = param_candidates(route, t, args.quick)[:args.max_candidates]
                results = []
                launcher = load_callable(route.launcher)
                for params in cands:
                    params = dict(params)
                    if "BLOCK_T" in route.params and "BLOCK_T" not in params:
                        params["BLOCK_T"] = min(64, max(16, triton.next_power_of_2(t)))
                    ws = torch.empty(max(1, linear_workspace_numel(name, t, n, k, epi, params)),
                                     device="cuda")
                    try:
                        fns = [lambda w=w: launcher(x, w, out, epilogue=epi, residual=res, workspace=ws,
                                                    **(params or {})) for w in copies]
                        us = time_graph(fns * max(1, 8 // len(fns)))
                        results.append({"params": params, "us": us})
                    except Exception as exc:
                        results.append({"params": params, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                ok = [r for r in results if "us" in r]
                best = min(ok, key=lambda r: r["us"]) if ok else None
                row = {"shape": shape, "format": fmt, "n": n, "k": k, "epilogue": epi, "t": t,
                       "route": name, "weight_bytes": wbytes, "candidates": results, **peer}
                if best:
                    us = best["us"]
                    row.update(us=us, params=best["params"], pct_read_bw=100.0 * wbytes / (us * 1e-6) / read_bw,
                               tflops=flops / (us * 1e-6) / 1e12)
                    cb = peer.get("cublas_bf16_us")
                    i4 = peer.get("torch_int4_us")
                    gu = peer.get("gemlite_us")
                    print(f"{shape:15s} T={t:5d} {name:18s} {us:9.1f} us {row['pct_read_bw']:5.1f}% "
                          f"{row['tflops']:7.1f} TF | cuBLAS {cb if cb is None else round(cb, 1)} "
                          f"int4 {i4 if i4 is None else round(i4, 1)} gemlite {gu if gu is None else round(gu, 1)} "
                          f"| {best['params']}", flush=True)
                else:
                    print(f"{shape:15s} T={t:5d} {name:18s} FAILED {results[0].get('error')}", flush=True)
                emit(row)
        del copies, wbf
        gl = None
        torch.cuda.empty_cache()
    write_markdown(args.out, prov, copy_bw, read_bw, rows)
    table = ratio_table(rows, read_bw, args.new)
    with open(os.path.join(args.out, "bench_linear.md"), "a") as f:
        f.write("\n" + "\n".join(table) + "\n")
    print("\n".join(table), flush=True)
    return 0


def ratio_table(rows, read_bw, new: str) -> list[str]:
    """Per shape and T: the best `new` route and the best other route (µs and cost / cost at T = 1),
    the streaming-read floor of the weights and the peers, all from this run."""
    out = [f"## cost(T) / cost(1): routes matching {new!r} vs the best other route (same run)", "",
           "| shape | T | new µs | new ÷T1 | new params | best other | µs | ÷T1 | floor µs | cuBLAS bf16 | torch int4 "
           "| gemlite |", "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    cells = {}
    for r in rows:
        if "us" not in r:
            continue
        key = (r["shape"], r["t"], new in r["route"])
        if key not in cells or r["us"] < cells[key]["us"]:
            cells[key] = r
    base = {}
    for (shape, t, is_new), r in cells.items():
        if t == 1:
            base[(shape, is_new)] = r["us"]
    seen = []
    for r in rows:
        if (r["shape"], r["t"]) not in seen:
            seen.append((r["shape"], r["t"]))

    def f(v):
        return "" if v is None else f"{v:.1f}"

    def f2(v):
        return "" if v is None else f"{v:.2f}"
    for shape, t in seen:
        nr, orr = cells.get((shape, t, True)), cells.get((shape, t, False))
        any_r = nr or orr
        if any_r is None:
            continue
        nb, ob = base.get((shape, True)), base.get((shape, False))
        out.append(f"| {shape} | {t} | {f(nr and nr['us'])} | {f2(nr['us'] / nb if nr and nb else None)} | "
                   f"{json.dumps(nr['params']) if nr else ''} | {orr['route'] if orr else ''} | {f(orr and orr['us'])} | "
                   f"{f2(orr['us'] / ob if orr and ob else None)} | {any_r['weight_bytes'] / read_bw * 1e6:.1f} | "
                   f"{f(any_r.get('cublas_bf16_us'))} | {f(any_r.get('torch_int4_us'))} | {f(any_r.get('gemlite_us'))} |")
    return out


def write_markdown(out_dir, prov, copy_bw, read_bw, rows):
    lines = [f"# Linear routes on {prov['gpu']}", "",
             f"date {prov['date']}; torch {prov['torch']}; triton {prov['triton']}; CUDA {prov['cuda']}; "
             f"nvidia-smi: {prov['nvidia_smi']}", "",
             f"device copy {copy_bw / 1e12:.2f} TB/s (bytes read + written); read roofline used for % = "
             f"{read_bw / 1e12:.2f} TB/s (max of the copy rate, the streaming read kernel of bench/limits.py and "
             f"bf16 cuBLAS GEMV weight reads at gate_up, T=1)",
             "", "Cold weights (launches rotate over copies > 150 MB), CUDA-graph replay, median µs per call.", "",
             "| shape | T | route | µs | % read BW | TFLOP/s | cuBLAS bf16 µs | torch int4 µs | params |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "us" not in r:
            lines.append(f"| {r['shape']} | {r['t']} | {r['route']} | failed | | | | | |")
            continue
        cb = r.get("cublas_bf16_us")
        i4 = r.get("torch_int4_us")
        lines.append(f"| {r['shape']} | {r['t']} | {r['route']} | {r['us']:.1f} | {r['pct_read_bw']:.1f} | "
                     f"{r['tflops']:.1f} | {'' if cb is None else f'{cb:.1f}'} | {'' if i4 is None else f'{i4:.1f}'} | "
                     f"{json.dumps(r['params'])} |")
    with open(os.path.join(out_dir, "bench_linear.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
