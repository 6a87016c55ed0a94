"""Tensor-core small-T GEMM, one pass for T = 1..64: routes `q4_gemm_tc`, `q5_gemm_tc`, `q6_gemm_tc`,
`w8_gemm_tc` (registered in `routes_gemm.py`).

Why. The gemv_tc routes (`gemv_tc.py`, `gemv_tc_w8.py`) put the tokens on the N side of
`mma.sync.m16n8k16` and dequantize each weight chunk once in registers, but one pass holds at most
two n8 tiles (16 columns): T = 17..32 runs as 16-column slices that re-read and re-dequantize the
weights (the T = 17 cliff), and T > 32 falls to `<f>_small_t_mma` (6x its T = 1 cost at T = 64, H100).
Here one program dequantizes each 16-row x 128-K weight tile ONCE per K step and feeds it to every
n8 column tile of its column block (up to BLOCK_T = 64 = 8 tiles) in the same pass.

Schedule (same lane map and K permutation as gemv_tc / gemv_tc_w8; their docstrings derive it):
one warp = 16 weight rows, lane (g, c) = (lane // 4, lane % 4) owns rows g, g + 8 and the chunk c of
each 128-lane K step; a program = NW warps = 16 NW rows x BLOCK_T columns x one K range.
The asm is split in two blocks so that registers stay bounded at any tile count:
- `ptx.dequant_asm_source(fmt)`: the lane's raw words of rows g, g + 8 (+ high words, scales) -> 32
  bf16x2 A-fragment registers, ordered as the 8 mma of the K step take them (mma i: A[4i .. 4i+3]);
- `ptx.mma_asm_source()`: one n8 column tile: 4 fp32 accumulators += the 8 mma of the K step, from the
  32 A registers and the tile's 16 x registers (mma i: x[2i], x[2i + 1]); operands A, x, accumulators.
Per K step the kernel runs the dequant block once, then the mma block once per column tile (a
static loop), loading each tile's 16 x registers (4 x 16-byte loads, L1 hits after the first warp)
just before its mma block. Grid (column blocks, row blocks, SPLIT_K); column blocks vary fastest so
the programs that share a weight tile run together (their weight reads meet in L2).

Arithmetic (gate_up, Q4 G64, N = 34816 x K = 5120, H100 read roofline ~3.0 TB/s measured):
- bytes: codes 34816 * 5120 / 2 = 89.1 MB + f16 scales 34816 * 80 * 2 = 5.6 MB = 94.7 MB -> 31.6 us
  at 3.0 TB/s, for every T (x: T * 10 KB, out: T * 35 KB: 4.5 MB at T = 64, +5%).
- MMA: 2 * N * K * ceil8(T) FLOPs = 0.36 / 2.9 / 5.7 / 11.4 / 22.8 GFLOP at T = 1 / 8 / 16 / 32 / 64;
  mma.sync bf16 on an H100 sustains roughly 600-650 TFLOP/s (dense wgmma ~990): 0.6 / 9 / 18 / 35 us
  at T = 1 / 16 / 32 / 64. So T <= 32 stays under the read floor; at T = 64 the tensor cores need
  about the read time itself: T = 64 can only be near 1.1-1.3x the floor if math and loads overlap.
- dequant: per lane and K step 2 rows x 16 bytes = 64 Q4 codes = 32 bf16x2 pairs at 4 ALU ops
  (prmt, lop3, fma bias, fma scale; + 1 shift per word) ~ 136 ops, independent of T: 89 M pairs x 4
  = 0.36 G ops over 132 SMs x 128 lanes x 1.75 GHz = 12 us, hidden under the 31.6 us of loads
  (the T = 1 GEMVs already pay it).
- x reads (L1): per warp and K step T x 256 bytes against 1 KB of Q4 weights: T / 4 times the weight
  bytes in L1 -> SM traffic. At T = 64 that is 16x: ~208 B/clk/SM needed at the read floor vs ~128
  B/clk/SM of L1 bandwidth: T = 64 is L1-bound near 1.6x the floor (T = 32: 0.8x, hidden). The
  lever past that (not built here): two 16-row m tiles per warp sharing each x fragment (halves it).
- registers per lane: 4 ceil8(T) accumulators (32 at T = 64) + 32 A + 16 x (one tile in flight) +
  8..12 words (+ the same again with PREFETCH) + ~12 addresses ~ 100-110 at T = 64 (swiglu doubles
  accumulators and A: ~180, so swiglu at T = 64 wants BLOCK_T = 32 or MAXNREG 255); T = 1 ~ 60.
- static SASS (bench/gemm_sass.py, Triton 3.6, sm_90, num_warps 4; one K-loop pass = one warp's
  K step; floors for the whole op at 1.755 GHz, HMMA at the dense peak of 4 clocks per scheduler):
  | op, T max          | regs | instr/step | HMMA | issue us | ALU us | HMMA us | read floor us |
  | gate_up Q4 swiglu 8 |  76 | 341 |  16 | 16.0 | 14.7 |  3.0 | 31.6 |
  | gate_up Q4 swiglu 64| 186 | 512 | 128 | 24.0 | 14.7 | 24.0 | 31.6 |
  | Q4 none 8 / 64      | 60 / 142 | 185 / 294 | 8 / 64 | 17.4 / 27.6 | 16.0 / 14.5 | 3.0 / 24.0 | 31.6 |
  | head Q6 8 / 64      | 64 / 142 | 235 / 343 | 8 / 64 | 157 / 230 | 157 / 146 | 21 / 172 | 331 |
  | down Q5 residual 64 (PREFETCH) | 142 | 353 | 64 | 16.6 | 12.0 | 12.0 | 19.5 |
  Every floor stays under the read floor at T = 64 with the HMMA at peak; at mma.sync's realistic
  ~6 clocks the HMMA floor is 1.5x those figures (gate_up 36 us, head 257 us): T = 64 lands near
  1.1-1.3x the read floor only if loads and math overlap (prediction: gate_up T = 64 <= 2x its T = 1).
- split-K: the fp32 partials cost SPLIT_K x T x N_out x 4 bytes written + read: at T = 64, SPLIT_K 8
  on gate_up that is 71 MB + 71 MB, more than the weights. The T = 1 GEMVs need SPLIT_K 4-8 for
  bytes in flight; past T ~ 16 the column blocks and longer per-step math give the parallelism, so
  the tuner should find SPLIT_K 1-2 there (both are in the sweep).

`REDUCE: fused` (epilogue.splitk_fixup) loses in 159 of 162 table rows: every split program ends with
fence.acq_rel.gpu (waits until all of its partial stores are acknowledged by L2, ~1 us), a barrier
and an acq_rel atomic before it can retire; with SPLIT_K 8 the 27B shapes run 4,000+ programs in
30+ waves, so that latency is paid once per program on the critical path of each SM slot, while the
separate reduce kernel costs one launch (~1.5 us in a graph) plus a coalesced pass over the partials.
The fix is not a better fixup but fewer partials: here the wide pass needs SPLIT_K 1-2 at T >= 16,
where the partials would cost most; `REDUCE: fused` is kept (one column block only) for the tuner.

No ASYNC (cp.async ring) variant: with Triton 3.6 (the card's) a plain tl.load of the weight chunks
re-lays the [NW, 8, 4] tensors out as threadsPerWarp [4, 8, 1] / warpsPerCTA [1, 1, 4] (checked by
an sm_90 compile on 2026-12-06; Triton 3.9 keeps the mma lane map), so the asm would see other lanes'
operands: gemv_tc's ASYNC variant compiles to that layout under 3.6 as well.

USE_ASM=False (always under the interpreter) runs `<f>_small_t_mma` (same math up to rounding,
BLOCK_T 16..64): the asm blocks are checked by the bit-level warp emulation of their PTX in the
tests, the lane layout by an sm_90 compile, and the whole asm path by the GPU-marked tests.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...errors import RouteError
from .epilogue import EPI_CODES, FIXUP_COUNTERS, fixup_counters, splitk_fixup
from .gemv_tc import _rows, _store, _x_tile
from .gemv_tc_w8 import _rows_w8, _x_tile_w8
from .launch import _FMT_CODE, asm_supported, check_call, named_launcher, reduce_split_k, splitk_workspace
from .ptx import W8, dequant_asm_source, dequant_constraints, mma_asm_source, mma_constraints
from .routes import linear_workspace_numel  # noqa: F401  (the family's sizing hook, on each launcher module)
from .weights import QuantWeight
from ..pdl import pdl_enter, pdl_launch

MAX_T = 64          # columns one launch serves (column blocks of BLOCK_T <= 64 on grid axis 0)


# the PTX text (ptx.py): the dequant block per format, the mma block per column tile
MMA = tl.constexpr(mma_asm_source())
MMAC = tl.constexpr(mma_constraints())
for _f in (4, 5, 6, W8):
    globals()[f"DQ_{_f}"] = tl.constexpr(dequant_asm_source(_f))
    globals()[f"DQC_{_f}"] = tl.constexpr(dequant_constraints(_f))


# ---------------------------------------------------------------------------------------------
# kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _load_rows(base_ptr, high_ptr, scale_ptr, row, kb, ci, base_row, high_row, scale_row, FMT: tl.constexpr):
    """Row `row`'s raw operands of K step kb for lane chunk c: Q4/5/6 (4 words, 2 high, scale); W8
    (8 words, 2 scales)."""
    if FMT == 8:
        r = _rows_w8(base_ptr, scale_ptr, row, kb, ci, base_row, scale_row)
    else:
        r = _rows(base_ptr, high_ptr, scale_ptr, row, kb, ci, base_row, high_row, scale_row, FMT)
    return r


@triton.jit
def _dq_asm(args, SRC: tl.constexpr, CONS: tl.constexpr):
    i = tl.int32
    return tl.inline_asm_elementwise(SRC, CONS, args, dtype=(i, i, i, i, i, i, i, i, i, i, i, i, i, i, i, i,
                                                             i, i, i, i, i, i, i, i, i, i, i, i, i, i, i, i),
                                     is_pure=True, pack=1)


@triton.jit
def _dequant(wg, wh, FMT: tl.constexpr):
    """The 32 A registers of this K step (rows g, g + 8) from their raw operands."""
    if FMT == 8:
        g0, g1, g2, g3, g4, g5, g6, g7, sg0, sg1 = wg
        h0, h1, h2, h3, h4, h5, h6, h7, sh0, sh1 = wh
        a = _dq_asm((g0, g1, g2, g3, g4, g5, g6, g7, h0, h1, h2, h3, h4, h5, h6, h7, sg0, sg1, sh0, sh1), DQ_8, DQC_8)
    else:
        g0, g1, g2, g3, gh0, gh1, sg = wg
        h0, h1, h2, h3, hh0, hh1, sh = wh
        if FMT == 4:
            a = _dq_asm((g0, g1, g2, g3, h0, h1, h2, h3, sg, sh), DQ_4, DQC_4)
        elif FMT == 5:
            a = _dq_asm((g0, g1, g2, g3, gh0, h0, h1, h2, h3, hh0, sg, sh), DQ_5, DQC_5)
        else:
            a = _dq_asm((g0, g1, g2, g3, gh0, gh1, h0, h1, h2, h3, hh0, hh1, sg, sh), DQ_6, DQC_6)
    return a


@triton.jit
def _tiles(acc, uacc, a, ua, x_ptr, col0, T, sx, word0, kw_last, FMT: tl.constexpr, EPI: tl.constexpr,
           NT: tl.constexpr):
    """acc (4 NT accumulators; uacc the up rows' for swiglu) += this K step's products: per column tile
    its x registers, then the mma block with the gate (and up) A registers."""
    f = tl.float32
    new = ()
    unew = ()
    for t in tl.static_range(NT):
        if FMT == 8:
            xt = _x_tile_w8(x_ptr, col0 + 8 * t, T, sx, word0, kw_last)
        else:
            xt = _x_tile(x_ptr, col0 + 8 * t, T, sx, word0, kw_last)
        # (the asm results are unpacked and re-packed: the interpreter's asm tuples are tl.tuple,
        # which concatenates only on the left)
        r0, r1, r2, r3 = tl.inline_asm_elementwise(MMA, MMAC, a + xt + (acc[4 * t], acc[4 * t + 1], acc[4 * t + 2],
                                                                       acc[4 * t + 3]),
                                                   dtype=(f, f, f, f), is_pure=True, pack=1)
        new = new + (r0, r1, r2, r3)
        if EPI == 1:
            v0, v1, v2, v3 = tl.inline_asm_elementwise(MMA, MMAC, ua + xt + (uacc[4 * t], uacc[4 * t + 1],
                                                                             uacc[4 * t + 2], uacc[4 * t + 3]),
                                                       dtype=(f, f, f, f), is_pure=True, pack=1)
            unew = unew + (v0, v1, v2, v3)
    if EPI != 1:
        unew = uacc
    return new, unew


@triton.jit
def _step(acc, uacc, base_ptr, high_ptr, scale_ptr, x_ptr, rg, rh, up_off, kb, ci3, col0, T, sx, kw_last, base_row,
          high_row, scale_row, FMT: tl.constexpr, EPI: tl.constexpr, NT: tl.constexpr):
    """One K step without a register prefetch: load, dequantize once, mma every column tile."""
    wg = _load_rows(base_ptr, high_ptr, scale_ptr, rg, kb, ci3, base_row, high_row, scale_row, FMT)
    wh = _load_rows(base_ptr, high_ptr, scale_ptr, rh, kb, ci3, base_row, high_row, scale_row, FMT)
    a = _dequant(wg, wh, FMT)
    ua = a
    if EPI == 1:
        wu = _load_rows(base_ptr, high_ptr, scale_ptr, rg + up_off, kb, ci3, base_row, high_row, scale_row, FMT)
        wv = _load_rows(base_ptr, high_ptr, scale_ptr, rh + up_off, kb, ci3, base_row, high_row, scale_row, FMT)
        ua = _dequant(wu, wv, FMT)
    if FMT == 8:
        word0 = kb * 16 + ci3 * 2
    else:
        word0 = kb * 16 + ci3 * 4
    return _tiles(acc, uacc, a, ua, x_ptr, col0, T, sx, word0, kw_last, FMT, EPI, NT)


@triton.jit
def gemm_tc_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr, cnt_ptr,
                   T, K, N_OUT, KB_TOTAL, base_row, high_row, scale_row, up_off, sx, so, sr, iters_per_split,
                   FMT: tl.constexpr, EPI: tl.constexpr, NT: tl.constexpr, SPLIT_K: tl.constexpr,
                   NW: tl.constexpr, PREFETCH: tl.constexpr = False,
                   FUSED_REDUCE: tl.constexpr = False, FIX_T: tl.constexpr = 64, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    # [NW, 8, 4]: warp, g = lane // 4, c = lane % 4 (the mma fragment owners)
    wi = tl.arange(0, NW)[:, None, None]
    gi = tl.arange(0, 8)[None, :, None]
    ci = tl.arange(0, 4)[None, None, :]
    zero_i = wi * 0 + gi * 0 + ci * 0
    row_g = pid_n * 16 * NW + wi * 16 + gi + zero_i
    row_h = row_g + 8
    rg = tl.minimum(row_g, N_OUT - 1)
    rh = tl.minimum(row_h, N_OUT - 1)
    c_base = pid_t * 8 * NT
    col0 = gi + zero_i + c_base
    ci3 = ci + zero_i
    kw_last = K // 8 - 1
    z = tl.zeros([NW, 8, 4], tl.float32)
    acc = ()
    for t in tl.static_range(4 * NT):
        acc = acc + (z,)
    uacc = acc
    kb0 = pid_k * iters_per_split
    kb1 = tl.minimum(kb0 + iters_per_split, KB_TOTAL)
    if FMT == 8:
        wstep = 2
    else:
        wstep = 4
    if PREFETCH:
        # register double buffer: the next K step's raw operands load before this step's dequant + mma
        # (inline-asm loads are invisible to Triton's pipeliner); the last load re-reads the last step
        kp = tl.minimum(kb0, KB_TOTAL - 1)
        wg = _load_rows(base_ptr, high_ptr, scale_ptr, rg, kp, ci3, base_row, high_row, scale_row, FMT)
        wh = _load_rows(base_ptr, high_ptr, scale_ptr, rh, kp, ci3, base_row, high_row, scale_row, FMT)
        wu = wg
        wv = wh
        if EPI == 1:
            wu = _load_rows(base_ptr, high_ptr, scale_ptr, rg + up_off, kp, ci3, base_row, high_row, scale_row,
                            FMT)
            wv = _load_rows(base_ptr, high_ptr, scale_ptr, rh + up_off, kp, ci3, base_row, high_row, scale_row,
                            FMT)
        for kb in range(kb0, kb1):
            kn = tl.minimum(kb + 1, kb1 - 1)
            ng = _load_rows(base_ptr, high_ptr, scale_ptr, rg, kn, ci3, base_row, high_row, scale_row, FMT)
            nh = _load_rows(base_ptr, high_ptr, scale_ptr, rh, kn, ci3, base_row, high_row, scale_row, FMT)
            nu = ng
            nv = nh
            if EPI == 1:
                nu = _load_rows(base_ptr, high_ptr, scale_ptr, rg + up_off, kn, ci3, base_row, high_row,
                                scale_row, FMT)
                nv = _load_rows(base_ptr, high_ptr, scale_ptr, rh + up_off, kn, ci3, base_row, high_row,
                                scale_row, FMT)
            a = _dequant(wg, wh, FMT)
            ua = a
            if EPI == 1:
                ua = _dequant(wu, wv, FMT)
            acc, uacc = _tiles(acc, uacc, a, ua, x_ptr, col0, T, sx, kb * 16 + ci3 * wstep, kw_last, FMT, EPI, NT)
            wg = ng
            wh = nh
            wu = nu
            wv = nv
    else:
        for kb in range(kb0, kb1):
            acc, uacc = _step(acc, uacc, base_ptr, high_ptr, scale_ptr, x_ptr, rg, rh, up_off, kb, ci3, col0, T, sx,
                              kw_last, base_row, high_row, scale_row, FMT, EPI, NT)
    # fragment: register i of tile t = out[row (g if i < 2 else g + 8)][column 8 t + 2 c + (i % 2)]
    mg = row_g < N_OUT
    mh = row_h < N_OUT
    for t in tl.static_range(NT):
        ca = c_base + 8 * t + ci3 * 2
        _store(acc[4 * t], uacc[4 * t], row_g, ca, mg & (ca < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so,
               sr, EPI, SPLIT_K)
        _store(acc[4 * t + 1], uacc[4 * t + 1], row_g, ca + 1, mg & (ca + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k,
               T, N_OUT, so, sr, EPI, SPLIT_K)
        _store(acc[4 * t + 2], uacc[4 * t + 2], row_h, ca, mh & (ca < T), out_ptr, res_ptr, ws_ptr, pid_k, T,
               N_OUT, so, sr, EPI, SPLIT_K)
        _store(acc[4 * t + 3], uacc[4 * t + 3], row_h, ca + 1, mh & (ca + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k,
               T, N_OUT, so, sr, EPI, SPLIT_K)
    if SPLIT_K > 1:
        if FUSED_REDUCE:  # one column block only (the launcher's rule): the tile is the program's rows
            splitk_fixup(ws_ptr, cnt_ptr, out_ptr, res_ptr, pid_n, pid_n * 16 * NW, T, N_OUT, so, sr,
                         SPLIT_K, EPI, 16 * NW, FIX_T, False)


# ---------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------
def _route(name):
    from .routes_gemm import GEMM_TC_ROUTES
    route = GEMM_TC_ROUTES.get(name)
    if route is None:
        raise RouteError(f"unknown tensor-core GEMM route {name!r}")
    return route


def column_blocks(T: int, block_t: int) -> tuple[int, int]:
    """(n8 tiles per program, column blocks) for T columns and the route's BLOCK_T bound."""
    nt = min(block_t // 8, triton.cdiv(T, 8))
    return nt, triton.cdiv(T, 8 * nt)


def launch_gemm_tc(route_name: str, x, weight, out, *, epilogue: str = "none", residual=None, workspace=None,
                   params=None) -> None:
    route = _route(route_name)
    if not isinstance(weight, QuantWeight):
        raise RouteError(f"route {route.name}: weight must be a row-split QuantWeight, got {type(weight).__name__}")
    fmt, n, k, T, n_out, p = check_call(route, x, weight, out, epilogue, residual, params)
    code = _FMT_CODE[fmt]
    use_asm = p["USE_ASM"]
    if use_asm is True and not asm_supported(x.device):
        raise RouteError(f"route {route.name}: USE_ASM=True needs a CUDA sm_90+ device outside the Triton interpreter")
    aligned = (k % 8 == 0 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
               and weight.words().data_ptr() % 16 == 0 and weight.scales().data_ptr() % 2 == 0
               and (code != 6 or weight.high_words().data_ptr() % 8 == 0))
    use_asm = aligned and (use_asm is True or (use_asm == "auto" and asm_supported(x.device)))
    if not use_asm:
        # same math (dequantized bf16 weights, fp32 accumulation) through the tiled tensor-core kernel
        from .launch import launch
        prefix = route.name.split("_", 1)[0]
        fb = {"BLOCK_T": min(64, max(16, triton.next_power_of_2(T))), "SPLIT_K": min(p["SPLIT_K"], 8),
              "USE_ASM": False}
        if fb["SPLIT_K"] != p["SPLIT_K"]:
            raise RouteError(f"route {route.name}: SPLIT_K={p['SPLIT_K']} has no small_t_mma fallback (at most 8)")
        return launch(f"{prefix}_small_t_mma", x, weight, out, epilogue=epilogue, residual=residual,
                      workspace=workspace, params=fb)
    res = residual if epilogue == "residual" else out
    split_k = p["SPLIT_K"]
    ws = splitk_workspace(route, split_k, T, n_out, epilogue, workspace, out)
    nw = p["num_warps"]
    nt, n_cb = column_blocks(T, p["BLOCK_T"])
    n_rb = triton.cdiv(n_out, 16 * nw)
    fused = split_k > 1 and p["REDUCE"] == "fused" and n_cb == 1 and n_rb <= FIXUP_COUNTERS
    cnt = fixup_counters(out) if fused else out
    kb_total = weight.k_pad // 128
    ips = triton.cdiv(kb_total, split_k)
    epi = EPI_CODES[epilogue]
    high = weight.high_words() if code in (5, 6) else weight.words()
    gemm_tc_kernel[(n_cb, n_rb, split_k)](
        x, weight.words(), high, weight.scales(), out, res, ws, cnt,
        T, k, n_out, kb_total, weight.base_row_bytes // 4, weight.high_row_bytes // 4, weight.groups_per_row,
        n_out, x.stride(0), out.stride(0), res.stride(0), ips,
        FMT=code, EPI=epi, NT=nt, SPLIT_K=split_k, NW=nw, PREFETCH=bool(p["PREFETCH"]),
        FUSED_REDUCE=fused, FIX_T=max(16, triton.next_power_of_2(8 * nt)), num_warps=nw, num_stages=1,
        **({"maxnreg": p["MAXNREG"]} if p["MAXNREG"] else {}), **pdl_launch(gemm_tc_kernel))
    if not fused:
        reduce_split_k(ws, out, res, T, n_out, split_k, epi)
    return None


q4_gemm_tc = named_launcher(launch_gemm_tc, "q4_gemm_tc", "Launch tensor-core GEMM route `q4_gemm_tc`.")
q5_gemm_tc = named_launcher(launch_gemm_tc, "q5_gemm_tc", "Launch tensor-core GEMM route `q5_gemm_tc`.")
q6_gemm_tc = named_launcher(launch_gemm_tc, "q6_gemm_tc", "Launch tensor-core GEMM route `q6_gemm_tc`.")
w8_gemm_tc = named_launcher(launch_gemm_tc, "w8_gemm_tc", "Launch tensor-core GEMM route `w8_gemm_tc`.")
