"""Where a decode GEMV's time goes, against reads of the same bytes (issue #16; needs a CUDA GPU).

For each 27B decode projection (Q4 / Q5 / Q6 row-split planes at their real shapes), in one run:
- `stream`: the streaming-read kernel of `limits.py` over exactly the weight's bytes, one launch per
  weight copy (rotated copies, together > 3x L2): what one launch of that size can read -- the ramp
  and the tail of a ~10-60 µs launch included, which the 256 MiB figure of `limits.py` hides;
- `tc_pattern U`: the tensor-core GEMV's access pattern alone (`gemv_tc.py`: a warp owns 16 rows,
  lane (g, c) reads 16 bytes of chunk c of rows g and g + 8 per 128-lane K step, plus the group
  scale and Q5 / Q6 high words), loads xor-reduced, no math; U K steps are requested before any
  is used (U = 1: one step in flight per lane, as the kernel without PREFETCH; 2: as PREFETCH);
- `row_pattern`: each warp reads 512 contiguous bytes of one row per instruction (the layout a
  streaming read has), rows split over programs, split-K as the GEMVs do;
  (the base plane only), and at 8 rows x 64 / 4 rows x 128 bytes per warp instruction;
- `tc_pattern ..._noscale`: the tc pattern without its 2-byte scale loads (TC_NO_SCALE configs);
- `lowreg_pattern`: a low-register / packed T = 1 route's own loads (its `_load_chunks` /
  `_x_chunks`, grid, tiling, prefetch and register cap) with the dequant + dot replaced by xors;
- `route T`: the table's own route at T = 1 and T = 4 (routes/sm90.yaml's selection), timed the
  tuner's way (`tune/measure.py`: CUDA graph over the rotated copies).
Every figure is µs per launch, GB/s of the bytes read: set side by side, they say how much of a
route's distance from a same-size read is its access pattern, its load schedule, or its math.

Usage (GPU):  python3 bench/gemv_probe.py --out OUT [--label L]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from limits import _stream_read_kernel  # noqa: E402
from ninfer_compile.kernels.linear.gemv_lowreg import _load_chunks, _x_chunks  # noqa: E402

# (op, format, n, k, epilogue): the 27B decode projections (contract qwen3.6-27b)
SHAPES = (
    ("mlp.gate_up", "Q4G64_F16S", 34816, 5120, "swiglu"),
    ("mlp.down_proj", "Q5G64_F16S", 5120, 17408, "residual"),
    ("gdn.value_z", "Q5G64_F16S", 12288, 5120, "none"),
    ("gdn.o_proj", "Q5G64_F16S", 5120, 6144, "residual"),
    ("gdn.query_key", "Q4G64_F16S", 4096, 5120, "none"),
    ("lm_head", "Q6G64_F16S", 248320, 5120, "none"),
)
# (warps, split-K, steps in flight) of the tc pattern; (rows, words per step, split-K, warps) of the
# row pattern
TC_CONFIGS = ((4, 1, 1), (4, 8, 1), (4, 8, 2), (4, 8, 4), (2, 8, 2), (2, 8, 4), (4, 4, 4), (4, 16, 2))
TC_NO_SCALE = ((2, 8, 2), (4, 8, 1))  # also timed without the scale loads
ROW_CONFIGS = ((2, 128, 1, 2), (4, 128, 1, 4), (8, 128, 2, 4), (4, 256, 1, 8), (16, 128, 4, 8),
               # a warp instruction over 8 rows x 64 bytes (the tc pattern's span) / 4 rows x 128 bytes:
               # is it the bytes per row and instruction that cost, or the tc pattern's other loads?
               (16, 16, 8, 2), (16, 32, 8, 4))
HIGH_BYTES_PER_64 = {"Q4G64_F16S": 0, "Q5G64_F16S": 8, "Q6G64_F16S": 16}


@triton.jit
def _tc_pattern_kernel(base_ptr, high_ptr, scale_ptr, out_ptr, N, KB_TOTAL, base_row, high_row, scale_row,
                       iters_per_split, NH: tl.constexpr, NW: tl.constexpr, U: tl.constexpr,
                       SCALES: tl.constexpr = True):
    """gemv_tc's loads without the math: [NW, 8, 4] lanes, rows g / g+8 of each warp's 16."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    wi = tl.arange(0, NW)[:, None, None, None]
    gi = tl.arange(0, 8)[None, :, None, None]
    ci = tl.arange(0, 4)[None, None, :, None]
    vi = tl.arange(0, 4)[None, None, None, :]
    row_g = tl.minimum(pid_n * 16 * NW + wi * 16 + gi, N - 1)
    row_h = tl.minimum(row_g + 8, N - 1)
    acc = tl.zeros([NW, 8, 4, 4], tl.int32)
    kb0 = pid_k * iters_per_split
    kb1 = tl.minimum(kb0 + iters_per_split, KB_TOTAL)
    for kb in range(kb0, kb1, U):
        for u in tl.static_range(U):
            k = kb + u
            m = (k + vi * 0) < kb1          # steps past the split are masked (never re-read)
            wg = tl.load(base_ptr + row_g * base_row + k * 16 + ci * 4 + vi, mask=m, other=0, cache_modifier=".cg")
            wh = tl.load(base_ptr + row_h * base_row + k * 16 + ci * 4 + vi, mask=m, other=0, cache_modifier=".cg")
            acc ^= wg ^ wh
            if SCALES:  # (False: the same pattern without its 2-byte scale loads)
                sg = tl.load(scale_ptr + row_g * scale_row + k * 2 + ci // 2 + vi * 0, mask=m, other=0).to(tl.int32)
                sh = tl.load(scale_ptr + row_h * scale_row + k * 2 + ci // 2 + vi * 0, mask=m, other=0).to(tl.int32)
                acc ^= sg ^ sh
            if NH > 0:
                hg = tl.load(high_ptr + row_g * high_row + k * 4 * NH + ci * NH + vi * 0, mask=m, other=0,
                             cache_modifier=".cg")
                hh = tl.load(high_ptr + row_h * high_row + k * 4 * NH + ci * NH + vi * 0, mask=m, other=0,
                             cache_modifier=".cg")
                acc ^= hg ^ hh
    tl.store(out_ptr + pid_n * tl.num_programs(1) + pid_k, tl.xor_sum(tl.reshape(acc, [NW * 128]), 0))


@triton.jit
def _row_pattern_kernel(base_ptr, out_ptr, N, row_words, words_per_split, ROWS: tl.constexpr,
                        BW: tl.constexpr):
    """ROWS rows per program, BW contiguous words of each row per step (16-byte loads)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = tl.minimum(pid_n * ROWS + tl.arange(0, ROWS), N - 1)[:, None]
    acc = tl.zeros([ROWS, BW], tl.int32)
    w0 = pid_k * words_per_split
    w1 = tl.minimum(w0 + words_per_split, row_words)
    for w in range(w0, w1, BW):
        offs = w + tl.arange(0, BW)[None, :]
        acc ^= tl.load(base_ptr + r * row_words + offs, mask=offs < w1, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid_n * tl.num_programs(1) + pid_k, tl.xor_sum(tl.reshape(acc, [ROWS * BW]), 0))


@triton.jit
def _xor16(v):
    a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3 = v
    return a0 ^ a1 ^ a2 ^ a3 ^ b0 ^ b1 ^ b2 ^ b3 ^ c0 ^ c1 ^ c2 ^ c3 ^ d0 ^ d1 ^ d2 ^ d3


@triton.jit
def _lowreg_pattern_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, N_OUT, KC_TOTAL, K, sx, base_row,
                           high_row, scale_row, up_off, FMT: tl.constexpr, SWIGLU: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """gemv_lowreg's own loads (its `_load_chunks` / `_x_chunks`, the PREFETCH double buffer, the
    same grid and tiling at T = 1), the dequant + dot replaced by one xor per loaded word."""
    KC: tl.constexpr = BLOCK_K // 32
    pid_n = tl.program_id(0)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N_OUT
    rows_c = tl.minimum(rows, N_OUT - 1)
    urows = rows_c + up_off
    kc = tl.arange(0, KC)
    acc = tl.zeros([BLOCK_N, KC], tl.int32)
    n_iters = tl.cdiv(KC_TOTAL, KC)
    shape: tl.constexpr = (BLOCK_N, KC)
    g0, g1, g2, g3, gh0, gh1, gs = _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c, rmask, kc, KC_TOTAL,
                                                base_row, high_row, scale_row, FMT)
    u0, u1, u2, u3, uh0, uh1, us = g0, g1, g2, g3, gh0, gh1, gs
    if SWIGLU:
        u0, u1, u2, u3, uh0, uh1, us = _load_chunks(base_ptr, high_ptr, scale_ptr, urows, rmask, kc, KC_TOTAL,
                                                    base_row, high_row, scale_row, FMT)
    for it in range(0, n_iters):
        cg = it * KC + kc
        nxt = cg + KC if PREFETCH else cg
        n0, n1, n2, n3, nh0, nh1, ns = _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c, rmask, nxt, KC_TOTAL,
                                                    base_row, high_row, scale_row, FMT)
        v0, v1, v2, v3, vh0, vh1, vs = n0, n1, n2, n3, nh0, nh1, ns
        if SWIGLU:
            v0, v1, v2, v3, vh0, vh1, vs = _load_chunks(base_ptr, high_ptr, scale_ptr, urows, rmask, nxt,
                                                        KC_TOTAL, base_row, high_row, scale_row, FMT)
        if not PREFETCH:  # this step's own chunks
            g0, g1, g2, g3, gh0, gh1, gs = n0, n1, n2, n3, nh0, nh1, ns
            u0, u1, u2, u3, uh0, uh1, us = v0, v1, v2, v3, vh0, vh1, vs
        xa, xb, xc, xd = _x_chunks(x_ptr, cg, KC_TOTAL, K, 1, sx, shape, 1)
        acc ^= g0 ^ g1 ^ g2 ^ g3 ^ gh0 ^ gh1 ^ gs.to(tl.int32, bitcast=True) ^ _xor16(xa)
        if SWIGLU:
            acc ^= u0 ^ u1 ^ u2 ^ u3 ^ uh0 ^ uh1 ^ us.to(tl.int32, bitcast=True)
        g0, g1, g2, g3, gh0, gh1, gs = n0, n1, n2, n3, nh0, nh1, ns
        u0, u1, u2, u3, uh0, uh1, us = v0, v1, v2, v3, vh0, vh1, vs
    tl.store(out_ptr + pid_n, tl.xor_sum(tl.reshape(acc, [BLOCK_N * KC]), 0))


def _graph_us(fns, reps: int = 20) -> float:
    from ninfer_compile.tune import measure as M
    return M.time_launches(fns, reps=reps, warmup=2)[0]


def _planes(fmt, n, k, copies, gen):
    g = k // 64
    out = []
    for _ in range(copies):
        base = torch.randint(-2**31, 2**31 - 1, (n, g * 8), dtype=torch.int32, device="cuda", generator=gen)
        hw = HIGH_BYTES_PER_64[fmt] * g // 4
        high = (torch.randint(-2**31, 2**31 - 1, (n, max(hw, 1)), dtype=torch.int32, device="cuda", generator=gen))
        scale = torch.randn(n, g, device="cuda", generator=gen).to(torch.float16)
        out.append((base, high, scale))
    return out


def _table_route(fmt, n, k, epi, t):
    """The shipped sm90 table's selection for this projection at T: (route, params)."""
    from ninfer_compile.routes.table import load_table
    sel = load_table(Path(__file__).resolve().parents[1] / "routes" / "sm90.yaml").select(
        "linear", t, {"format": fmt, "n": n, "k": k, "epilogue": epi})
    return sel.route, sel.params


def probe_shape(op, fmt, n, k, epi, l2_bytes, gen) -> dict:
    g = k // 64
    nh = HIGH_BYTES_PER_64[fmt] // 8  # high words per 32-lane chunk (Q5 1, Q6 2)
    wbytes = n * g * (32 + HIGH_BYTES_PER_64[fmt] + 2)
    copies = max(2, min(16, -(-3 * l2_bytes // wbytes)))
    res = {"op": op, "format": fmt, "n": n, "k": k, "epilogue": epi, "weight_bytes": wbytes, "copies": copies}

    # same-size streaming read (contiguous words), best of a few launch shapes
    n_words = wbytes // 4
    bufs = [torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device="cuda", generator=gen)
            for _ in range(copies)]
    best = None
    for block, iters, warps in ((1024, 8, 4), (2048, 4, 4), (2048, 8, 8), (4096, 4, 8), (4096, 8, 8)):
        grid = (triton.cdiv(n_words, block * iters),)
        o = torch.empty(grid[0], dtype=torch.int32, device="cuda")
        fns = [lambda b=b: _stream_read_kernel[grid](b, o, n_words, BLOCK=block, ITERS=iters, num_warps=warps)
               for b in bufs]
        us = _graph_us(fns)
        if best is None or us < best[0]:
            best = (us, f"B{block}xI{iters}w{warps}")
    res["stream"] = {"us": best[0], "config": best[1]}
    del bufs
    torch.cuda.empty_cache()

    planes = _planes(fmt, n, k, copies, gen)
    kb_total = k // 128
    res["tc_pattern"] = {}
    for nw, split, u in TC_CONFIGS:
        ips = -(-kb_total // split)
        grid = (triton.cdiv(n, 16 * nw), split)
        o = torch.empty(grid[0] * split, dtype=torch.int32, device="cuda")
        fns = [lambda p=p: _tc_pattern_kernel[grid](p[0], p[1], p[2], o, n, kb_total, g * 8, p[1].shape[1],
                                                     g, ips, NH=nh, NW=nw, U=u, num_warps=nw)
               for p in planes]
        res["tc_pattern"][f"nw{nw}_sk{split}_u{u}"] = _graph_us(fns)
        if (nw, split, u) in TC_NO_SCALE:
            fns = [lambda p=p: _tc_pattern_kernel[grid](p[0], p[1], p[2], o, n, kb_total, g * 8, p[1].shape[1],
                                                         g, ips, NH=nh, NW=nw, U=u, SCALES=False, num_warps=nw)
                   for p in planes]
            res["tc_pattern"][f"nw{nw}_sk{split}_u{u}_noscale"] = _graph_us(fns)
    res["row_pattern"] = {}
    row_words = g * 8
    for rows, bw, split, warps in ROW_CONFIGS:
        wps = -(-row_words // split)
        wps = -(-wps // bw) * bw
        grid = (triton.cdiv(n, rows), split)
        o = torch.empty(grid[0] * split, dtype=torch.int32, device="cuda")
        fns = [lambda p=p: _row_pattern_kernel[grid](p[0], o, n, row_words, wps, ROWS=rows, BW=bw, num_warps=warps)
               for p in planes]
        res["row_pattern"][f"r{rows}_bw{bw}_sk{split}_w{warps}"] = _graph_us(fns)
    # the T = 1 route's own loads without its math (low-register / packed routes only)
    route1, p1 = _table_route(fmt, n, k, epi, 1)
    if route1.name.endswith("_gemv_lowreg"):
        fmt_code = {"Q4G64_F16S": 4, "Q5G64_F16S": 5, "Q6G64_F16S": 6}[fmt]
        swiglu = epi == "swiglu"
        n_out = n // 2 if swiglu else n
        bn, bk = int(p1.get("BLOCK_N", 8)), int(p1.get("BLOCK_K", 1024))
        x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
        grid = (triton.cdiv(n_out, bn),)
        o = torch.empty(grid[0], dtype=torch.int32, device="cuda")
        extra = {"maxnreg": int(p1["MAXNREG"])} if p1.get("MAXNREG") else {}
        res["lowreg_pattern"] = {}
        try:
            for pf in (bool(p1.get("PREFETCH", False)), not bool(p1.get("PREFETCH", False))):
                fns = [lambda p=p, pf=pf: _lowreg_pattern_kernel[grid](
                           x, p[0], p[1], p[2], o, n_out, k // 32, k, k, g * 8, p[1].shape[1], g, n_out,
                           FMT=fmt_code, SWIGLU=swiglu, BLOCK_N=bn, BLOCK_K=bk, PREFETCH=pf,
                           num_warps=int(p1.get("num_warps", 4)), **extra)
                       for p in planes]
                res["lowreg_pattern"][f"{route1.name} params, PREFETCH={pf}"] = _graph_us(fns)
        except Exception as exc:  # noqa: BLE001 -- a probe part that fails says so and the rest still runs
            print(f"probe {op}: lowreg pattern failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    del planes
    torch.cuda.empty_cache()

    # the table's route at T = 1 and 4, timed the tuner's way
    from ninfer_compile.tune import measure as M
    from ninfer_compile.tune.shapes import MatchCase
    res["route"] = {}
    case = MatchCase(family="linear", match={"format": fmt, "n": n, "k": k, "epilogue": epi}, shapes={})
    for t in (1, 4):
        route, params = _table_route(fmt, n, k, epi, t)
        bench = M.build(case, t)
        err = bench.check(route, params)
        us = M.time_launches(bench.launches(route, params), reps=20, warmup=2)[0]
        res["route"][str(t)] = {"route": route.name, "params": params, "us": us, "rel_rms": err}
        del bench
        torch.cuda.empty_cache()
    return res


def render(results: list[dict], env: dict) -> str:
    gb = lambda b, us: b / (us * 1e-6) / 1e9  # noqa: E731
    lines = [f"# Decode GEMV probe: {env['device']}, {env['date']}", "",
             f"torch {env['torch']}, triton {env['triton']}; µs per launch (CUDA graph over rotated cold copies), "
             "GB/s of the weight's bytes (base + high + scale planes)", "",
             "The row pattern reads the base (nibble) plane only -- 32 of the 34 / 42 / 50 bytes per 64 weights "
             "of Q4 / Q5 / Q6 -- so its GB/s are of that plane's bytes.", "",
             "| op | MB | stream µs (GB/s) | best tc pattern µs | tc U=1 sk8 µs | tc without its scale loads µs (best) | best row pattern µs (GB/s of the base plane) | route T=1 µs (GB/s) | route T=4 µs | route T=1 / stream |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b = r["weight_bytes"]
        s = r["stream"]["us"]
        tc = {k: v for k, v in r["tc_pattern"].items() if not k.endswith("_noscale")}
        tcn = {k: v for k, v in r["tc_pattern"].items() if k.endswith("_noscale")}
        tcb = min(tc, key=tc.get)
        tcn_s = f"{min(tcn.values()):.1f} ({min(tcn, key=tcn.get)})" if tcn else "-"
        rwb = min(r["row_pattern"], key=r["row_pattern"].get)
        r1 = r["route"].get("1", {})
        r4 = r["route"].get("4", {})
        u1 = r1.get("us")
        lines.append(
            f"| {r['op']} | {b / 1e6:.1f} | {s:.1f} ({gb(b, s):.0f}) | {r['tc_pattern'][tcb]:.1f} ({tcb}) | "
            f"{r['tc_pattern'].get('nw4_sk8_u1', float('nan')):.1f} | {tcn_s} | {r['row_pattern'][rwb]:.1f} "
            f"({gb(r['n'] * (r['k'] // 64) * 32, r['row_pattern'][rwb]):.0f}; {rwb}) | "
            + (f"{u1:.1f} ({gb(b, u1):.0f}) {r1['route']}" if u1 else "-") + " | "
            + (f"{r4['us']:.1f} {r4['route']}" if r4.get("us") else "-") + " | "
            + (f"{u1 / s:.2f}x" if u1 else "-") + " |")
    lines += ["", "The T = 1 route's own loads (same grid, tiling, prefetch, register cap) without its dequant + dot (µs):", ""]
    for r in results:
        if r.get("lowreg_pattern"):
            lines.append(f"- {r['op']}: " + ", ".join(f"{k} {v:.1f}" for k, v in r["lowreg_pattern"].items())
                         + (f"; the route itself {r['route']['1']['us']:.1f}" if "1" in r.get("route", {}) else ""))
    lines += ["", "All tc-pattern and row-pattern configurations (µs):", ""]
    for r in results:
        lines.append(f"- {r['op']}: tc " + ", ".join(f"{k} {v:.1f}" for k, v in r["tc_pattern"].items())
                     + "; row " + ", ".join(f"{k} {v:.1f}" for k, v in r["row_pattern"].items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="27b")
    ap.add_argument("--ops", default="", help="comma list of op names (default: all)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: gemv_probe needs a CUDA GPU")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    from ninfer_compile.tune import measure as M
    M.set_l2_bytes(l2)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    want = {s for s in a.ops.split(",") if s}
    results = []
    for shape in SHAPES:
        if want and shape[0] not in want:
            continue
        t0 = time.time()
        r = probe_shape(*shape, l2, gen)
        r["elapsed_s"] = time.time() - t0
        results.append(r)
        env = {"device": props.name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "torch": torch.__version__, "triton": triton.__version__}
        # written after every shape: a call cut short keeps what it measured
        (out / f"gemv_probe_{a.label}.json").write_text(json.dumps({"environment": env, "results": results}, indent=1))
        (out / f"gemv_probe_{a.label}.md").write_text(render(results, env))
        print(f"probe {shape[0]}: stream {r['stream']['us']:.1f} us, tc best "
              f"{min(v for c, v in r['tc_pattern'].items() if not c.endswith('_noscale')):.1f}, row best {min(r['row_pattern'].values()):.1f}, route "
              + ", ".join(f"T{t} {v['route']} {v['us']:.1f} (rel {v['rel_rms']:.1e})" for t, v in r["route"].items()),
              flush=True)
    if results:
        print(render(results, env))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
