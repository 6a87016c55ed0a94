"""MoE routes on the GPU at the qwen3.6-35b-a3b shapes: the router and the two expert routes per T,
uniform and skewed routing, against the byte floor and torch bf16 in the same run.

    PYTHONPATH=. python bench/bench_moe.py --out DIR [--banks q4_q5,q4_q6,w8] [--t 1,8,64]
        [--budget-s 900] [--max-candidates N] [--reps 20]
    PYTHONPATH=. python bench/bench_moe.py --dry-run --out DIR     # CPU, Triton interpreter, tiny shapes

Shapes: H 2048, E 256 routed experts, top-8, expert width I 512; gate_up bank [E*2I, H] at Q4G64
(W8G32 on the MTP layer), down bank [E*H, I] at Q5G64 (Q6G64 on 3 layers); router BF16 [E+1, H].
Routing (per T, two distributions): `uniform`: 8 distinct experts per token uniformly; `skewed`:
per token 4 distinct experts of 16 fixed hot ones and 4 distinct others uniformly.

Cold operands: every timed call reads its own routing draw and its own copy of the banks (copies
rotated so that > 3x L2 of other rows are read between two uses of a copy; the router weight
likewise). A CUDA graph holds one call per draw; median µs per call over its replays.

Per row: µs, distinct experts hit (mean over the draws), the bytes the step needs (the hit experts'
gate_up + down rows at their stored formats + x, shared, residual, out and the routing), the floor
= those bytes at the streaming read rate measured in this run (bench/limits.py), % of the floor, and
the peer: the same op in torch bf16 (per hit expert: gather its tokens, two cuBLAS matmuls, SwiGLU,
fp32 weighted sum), which reads the bf16 rows of each hit expert, ~3.3x the stored bytes (the ratio
is printed). `check`: relative RMS error of the first call against the fp32 reference.
Params: the tuner's curated candidates (kernels/moe/tune.py) while --budget-s lasts, then the
route defaults only. Writes DIR/bench_moe.json (after every row) and DIR/bench_moe.md.
`--dry-run`: E 16, H 96, I 32, top-2, T 1, 3, 17, one draw, one config per route with the largest
tiles (the fewest interpreted programs); the timings are interpreter times, not measurements.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import moe_bench_ops as O  # noqa: E402

T_ALL = (1, 2, 3, 4, 5, 8, 12, 16, 17, 24, 32, 48, 64)
T_DRY = (1, 3, 17)
DISTS = ("uniform", "skewed")
EXPERT_ROUTES = ("moe_experts_gemv", "moe_experts_grouped_gemm")
DRY_BW = 1e9  # the dry run's stand-in read rate (bytes/s): no measurement on the CPU


def provenance(dry: bool) -> dict:
    import triton

    p = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
         "triton": triton.__version__, "python": platform.python_version(), "command": " ".join(sys.argv)}
    if dry:
        return {**p, "gpu": "none (CPU, TRITON_INTERPRET=1: interpreter times, not measurements)"}
    return {**p, "gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "cuda": torch.version.cuda, "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}


def route_params(route, t: int, args, started: float) -> list[dict]:
    """The params timed for `route` at T: the dry run's largest tiles; else the tuner's candidates
    (defaults first) while the budget lasts, then the defaults alone."""
    from ninfer_compile.tune.measure import param_candidates

    if args.dry_run:
        big = {k: max(route.params[k].choices) for k in ("BLOCK_N", "BLOCK_K") if k in route.params}
        return [big]
    cands = param_candidates(route, t, quick=False)[:args.max_candidates]
    return cands if time.time() - started < args.budget_s else cands[:1]


def best_of(route, t, args, started, fns_of, check) -> dict:
    """Time every param set of `route` (fns_of(params) -> one call per draw); the fastest one, all
    tried, and the reference check of the fastest."""
    tried = []
    for params in route_params(route, t, args, started):
        try:
            fns = fns_of(params)
            if args.dry_run:  # the interpreter: the one timed call is the checked one
                errs: list[float] = []
                us, mode = O.time_calls([lambda: errs.append(check(fns[0]))], 1, False)
                tried.append({"params": params, "us": us, "mode": mode, "check": errs[0]})
            else:
                us, mode = O.time_calls(fns, args.reps, True)
                tried.append({"params": params, "us": us, "mode": mode})
        except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
            tried.append({"params": params, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    ok = [r for r in tried if "us" in r]
    if not ok:
        return {"error": tried[0]["error"] if tried else "no params", "candidates": tried}
    best = min(ok, key=lambda r: r["us"])
    if "check" not in best:
        best["check"] = check(fns_of(best["params"])[0])
    return {"us": best["us"], "params": best["params"], "mode": best["mode"], "check": best["check"],
            "candidates": tried}


def bench_router(t, geo, args, started, gen, dev, bw) -> list[dict]:
    """The router routes whose domain covers T, one row each."""
    from ninfer_compile.kernels.moe.tune import routing_error
    from ninfer_compile.kernels.registry import get_route
    from ninfer_compile.tune import measure as M

    L, R = O.kernels()
    E, H, k = geo["E"], geo["H"], geo["top_k"]
    one = O.row_bytes(O.ROUTER_FORMAT, H) * (E + 1)
    weights = [M.random_linear_weight(O.ROUTER_FORMAT, E + 1, H, gen)
               for _ in range(1 if args.dry_run else O.n_cold(one, 4, 256))]
    x = M.randn((t, H), gen)
    ids = torch.zeros(t, k, dtype=torch.int32, device=dev)
    wts = torch.zeros(t, k, dtype=torch.float32, device=dev)
    gate = torch.zeros(t, dtype=torch.float32, device=dev)
    logits = torch.empty(t * (E + 1), dtype=torch.float32, device=dev)
    launchers = {"moe_router_split": lambda w, params: L.moe_router_split(x, w, ids, wts, gate, k, workspace=logits,
                                                                          **params)}

    def check(fn):
        fn()
        return routing_error((ids, wts, gate), R.moe_router(x, weights[0], k), E)

    nbytes = one + t * H * 2 + t * (k * 8 + 4)
    rows = []
    for name, launch in launchers.items():
        route = get_route(name)
        if route.domain.max_t is not None and t > route.domain.max_t:
            continue
        row = {"op": "router", "route": name, "t": t, "bytes": nbytes, "floor_us": nbytes / bw * 1e6,
               **best_of(route, t, args, started,
                         lambda params, launch=launch: [lambda w=w: launch(w, params) for w in weights], check)}
        if "us" in row:
            row["pct_floor"] = 100.0 * row["floor_us"] / row["us"]
        rows.append(row)
    return rows


def bench_experts(t, dist, lay, hot, args, started, gen, dev, bw, n_draws) -> list[dict]:
    from ninfer_compile.kernels.moe.routes import GEMV_MAX_T, workspace_layout
    from ninfer_compile.kernels.registry import get_route
    from ninfer_compile.tune import measure as M

    L, R = O.kernels()
    geo = lay.geo
    E, H, I, k = geo["E"], geo["H"], geo["I"], geo["top_k"]
    draws = O.make_draws(n_draws, t, geo, dist, gen, dev, hot)
    x, shared, residual = M.randn((t, H), gen), M.randn((t, H), gen, 0.1), M.randn((t, H), gen, 0.1)
    out = torch.empty(t, H, dtype=torch.bfloat16, device=dev)
    ws = torch.empty(workspace_layout(E, I, H, t * k)["total"], dtype=torch.float32, device=dev)
    d0 = draws[0]
    ref = R.moe_experts(x, d0.ids, d0.weights, *lay.ref_banks, shared, d0.gate, residual)
    hits = sum(d.hits for d in draws) / len(draws)
    act = O.activation_bytes(t, geo)
    nbytes, peer_bytes = hits * lay.expert_bytes + act, hits * lay.expert_bytes_bf16 + act
    base = {"t": t, "dist": dist, "gate_up": lay.gu_fmt, "down": lay.dn_fmt, "draws": len(draws), "hits": hits,
            "bytes": nbytes, "floor_us": nbytes / bw * 1e6}

    def check(fn):
        out.fill_(float("nan"))
        fn()
        return M.rel_rms(out, ref)

    rows = []
    for name in EXPERT_ROUTES:
        if name == "moe_experts_gemv" and t > GEMV_MAX_T:
            continue
        launcher = getattr(L, name)

        def fns_of(params, launcher=launcher):
            return [lambda d=d, b=lay.banks[i % len(lay.banks)]: launcher(
                x, d.ids, d.weights, b[0], b[1], shared, d.gate, residual, out, workspace=ws, **params)
                for i, d in enumerate(draws)]

        row = {"op": "experts", "route": name, **base, **best_of(get_route(name), t, args, started, fns_of, check)}
        if "us" in row:
            row["pct_floor"] = 100.0 * row["floor_us"] / row["us"]
        rows.append(row)
    peer = [lambda d=d, b=lay.bf16[i % len(lay.bf16)]: O.peer_call(x, d, b[0], b[1], shared, residual, out, I)
            for i, d in enumerate(draws)]
    peer_row = {"peer_bytes": peer_bytes, "peer_byte_ratio": peer_bytes / nbytes}
    try:
        peer_row["peer_check"] = check(peer[0])
        peer_row["peer_us"], _ = O.time_calls(peer, args.reps, not args.dry_run)
        peer_row["peer_pct_floor"] = 100.0 * (nbytes / bw * 1e6) / peer_row["peer_us"]
    except Exception as exc:  # noqa: BLE001
        peer_row["peer_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return [{**r, **peer_row} for r in rows]


def run(args) -> dict:
    from ninfer_compile.kernels.moe.tune import expected_hits
    from ninfer_compile.tune import measure as M

    dry = args.dry_run
    dev = torch.device("cpu" if dry else "cuda")
    M.DEVICE = "cpu" if dry else None
    geo = O.GEOMETRY["dry" if dry else "35b"]
    gen = M.generator(args.seed)
    res = {"provenance": provenance(dry), "dry_run": dry, "geometry": geo, "rows": [], "errors": []}
    if dry:
        res["read_bw"], res["read_bw_source"] = DRY_BW, "dry run: a stand-in rate, not a measurement"
    else:
        from limits import streaming_read_gbs

        s = streaming_read_gbs(torch)
        res["read_bw"], res["read_bw_source"] = s["gbs"] * 1e9, f"bench/limits.py streaming_read_gbs ({s['config']})"
    bw = res["read_bw"]
    print(f"# {res['provenance']['gpu']}; torch {res['provenance']['torch']} triton {res['provenance']['triton']}; "
          f"read rate {bw / 1e12:.2f} TB/s ({res['read_bw_source']})", flush=True)

    def save():
        with open(os.path.join(args.out, "bench_moe.json"), "w") as f:
            json.dump(res, f, indent=1)

    started = time.time()
    t_list = [int(v) for v in args.t.split(",")] if args.t else list(T_DRY if dry else T_ALL)
    for t in t_list:
        for row in bench_router(t, geo, args, started, gen, dev, bw):
            res["rows"].append(row)
            print(line(row), flush=True)
        save()
    hot = torch.randperm(geo["E"], generator=gen, device=dev)[:geo["hot"]]
    res["hot_experts"] = sorted(hot.tolist())
    for bank in args.banks.split(","):
        lay = O.build_layer(geo, bank, 1 if dry else 12, 1 if dry else 4, dev, gen)
        for t in t_list:
            n_draws = 1 if dry else O.n_cold(expected_hits(t, geo["E"], geo["top_k"]) * lay.expert_bytes, 8, 16)
            for dist in DISTS:
                try:
                    rows = bench_experts(t, dist, lay, hot, args, started, gen, dev, bw, n_draws)
                except Exception as exc:  # noqa: BLE001 - keep what was measured
                    res["errors"].append(f"{bank} T={t} {dist}: {type(exc).__name__}: {str(exc)[:300]}")
                    print(res["errors"][-1], flush=True)
                    continue
                for r in rows:
                    res["rows"].append(r)
                    print(line(r), flush=True)
                save()
        del lay
        if not dry:
            torch.cuda.empty_cache()
    return res


def _f(v, fmt=".1f"):
    return "" if v is None else format(v, fmt)


def line(r: dict) -> str:
    if r["op"] == "router":
        return (f"router T={r['t']:3d} {r['route']:17s} {_f(r.get('us')):>8s} us floor {_f(r['floor_us'], '.2f')} us "
                f"{_f(r.get('pct_floor'))}% {r.get('params', r.get('error'))}")
    return (f"{r['gate_up'][:2]}/{r['down'][:2]} T={r['t']:3d} {r['dist']:7s} {r['route']:24s} "
            f"{_f(r.get('us')):>8s} us hits {r['hits']:6.1f} {r['bytes'] / 1e6:7.2f} MB floor "
            f"{_f(r['floor_us'], '.2f')} us {_f(r.get('pct_floor'))}% | bf16 torch {_f(r.get('peer_us'))} us | "
            f"check {_f(r.get('check'), '.1e')} | {r.get('params', r.get('error'))}")


def markdown(res: dict) -> str:
    p, geo = res["provenance"], res["geometry"]
    ratio = [r["peer_byte_ratio"] for r in res["rows"] if "peer_byte_ratio" in r]
    out = [f"# MoE routes on {p['gpu']}", "",
           f"date {p['date']}; torch {p['torch']}; triton {p['triton']}; command `{p['command']}`", "",
           f"geometry: E {geo['E']}, H {geo['H']}, I {geo['I']}, top-{geo['top_k']}; skewed routing: half of each "
           f"token's slots on {geo['hot']} fixed hot experts {res.get('hot_experts', '')}, the rest uniform", "",
           f"floor = bytes needed / {res['read_bw'] / 1e12:.3f} TB/s ({res['read_bw_source']}). Cold: one routing "
           f"draw and one bank copy per call (> 3x L2 between reuses), CUDA-graph replay, median µs per call.",
           f"Peer: torch bf16, per hit expert two cuBLAS matmuls; it reads "
           f"~{(sum(ratio) / len(ratio)) if ratio else 0:.1f}x the bytes of the stored formats (its % of floor "
           f"is against OUR byte floor).", "", "## Router (BF16 [E+1, H], rotated copies)", "",
           "| T | route | µs | bytes | floor µs | % of floor | params | check |", "|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in res["rows"]:
        if r["op"] == "router":
            out.append(f"| {r['t']} | {r['route']} | {_f(r.get('us'))} | {r['bytes']:,} | {r['floor_us']:.2f} | "
                       f"{_f(r.get('pct_floor'))} | {json.dumps(r.get('params', r.get('error')))} | "
                       f"{_f(r.get('check'), '.1e')} |")
    out += ["", "## Experts (group + gate/up + down + combine launches)", "",
            "| banks | T | routing | route | µs | hits | MB needed | floor µs | % of floor | params | check "
            "| torch bf16 µs | bf16 % of floor |", "|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in res["rows"]:
        if r["op"] == "experts":
            out.append(f"| {r['gate_up'][:2]}+{r['down'][:2]} | {r['t']} | {r['dist']} | {r['route']} | "
                       f"{_f(r.get('us'))} | {r['hits']:.1f} | {r['bytes'] / 1e6:.2f} | {r['floor_us']:.2f} | "
                       f"{_f(r.get('pct_floor'))} | {json.dumps(r.get('params', r.get('error')))} | "
                       f"{_f(r.get('check'), '.1e')} | {_f(r.get('peer_us'))} | {_f(r.get('peer_pct_floor'))} |")
    if res["errors"]:
        out += ["", "Errors:", *(f"- {e}" for e in res["errors"])]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes (no measurement)")
    ap.add_argument("--banks", default="q4_q5", help=f"comma-separated bank formats: {', '.join(O.BANKS)}")
    ap.add_argument("--t", default=None, help="comma-separated T values (default %s; dry %s)" % (T_ALL, T_DRY))
    ap.add_argument("--budget-s", type=float, default=900.0, help="after this, only the route defaults are timed")
    ap.add_argument("--max-candidates", type=int, default=8, help="param sets per route and T")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per timing (median)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bad = [b for b in args.banks.split(",") if b not in O.BANKS]
    if bad:
        print(f"bench_moe: unknown --banks {bad} (known: {', '.join(O.BANKS)})", file=sys.stderr)
        return 2
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.reps = 1
    elif not torch.cuda.is_available():
        print("bench_moe: needs a CUDA GPU (or --dry-run on the CPU); nothing measured", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    res = run(args)
    with open(os.path.join(args.out, "bench_moe.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, "bench_moe.md"), "w") as f:
        f.write(md)
    print(md)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
