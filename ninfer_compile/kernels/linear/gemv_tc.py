"""Tensor-core decode GEMV (T <= 16 per pass; T <= 32 in 16-column slices) for the row-split Q4 / Q5 / Q6
planes: routes `q4_gemv_tc`,
`q5_gemv_tc`, `q6_gemv_tc` (registered in `routes.py`; the PTX text in `ptx.py`).

Why: for T = 2..16 (concurrent sequences, MTP verification) the CUDA-core GEMVs pay their dot
product per column, and the tiled tensor-core schedules pay a dequant + layout change per tile.
Here the dequantized weights go straight from registers into `mma.sync.m16n8k16` (bf16, fp32
accumulate), so one dequant serves up to 16 columns and the weights are read once.

Work split (one warp = 16 weight rows; a program = num_warps warps = 16 * num_warps rows):
lane (g, c) = (lane // 4, lane % 4) owns weight rows g and g + 8 of its warp's tile and, per
128-lane K step, the 16-byte chunk c of each (lanes 32c .. 32c+31 of the step). The mma's k slots
are a permutation of K, applied identically to the A (weights) and B (activations) fragments:
for word j of the chunk, mma (j, h) covers lanes 32c + 8j + 4h + {0..3} of every c; A registers
{P_2h, Q_2h, P_2h+1, Q_2h+1} (pairs of rows g / g+8) and B registers {x pair 2h, x pair 2h+1} of
column g's 16-byte load j. So every operand is one 16-byte load: weights (rows g, g+8), x (column
g [+ 8], 4 per tile) -- no shuffles, no shared memory.
Dequant per word: the lowreg prmt/lop3 magic-number pairs (exact codes, bf16x2), times the group
scale (one fma.rn.bf16x2 with -0: the weight rounded to bf16, as `dequant_gemm` does).
Accumulator fragment: lane (g, c) holds out[row g / g+8][column 2c, 2c+1] of each 8-column tile.

The asm path needs every value of a [num_warps, 8, 4] tensor to live in the lane the mma expects
(Triton's default blocked layout for that shape: lane = 4 g + c, warp = axis 0). Loads, stores and
the residual read are therefore inline asm as well: no tl.load / tl.store anchors a layout the
compiler could propagate into the asm. USE_ASM=False (always under the interpreter) runs the
`<f>_small_t_mma` kernel instead (same math up to rounding): correctness of the asm path is
checked by a bit-level warp emulation of its PTX (tests) and by the GPU tests.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...errors import RouteError
from .epilogue import EPI_CODES, FIXUP_COUNTERS, fixup_counters, splitk_fixup
from .launch import _FMT_CODE, asm_supported, check_call, named_launcher, reduce_split_k, splitk_workspace
from .ptx import (LD_1, LD_2, LD_BF16, LD_F16, LD_W, LD_X, SHFL_F16, ST_16, ST_32, tc_step_asm_source,
                  tc_step_constraints)
from .routes import linear_workspace_numel  # noqa: F401  (the family's sizing hook, on each launcher module)
from .weights import QuantWeight
from ..pdl import pdl_enter
from ..pdl import pdl_launch

MAX_T = 16


for _f in (4, 5, 6):
    for _n in (1, 2):
        globals()[f"TC_{_f}_{_n}"] = tl.constexpr(tc_step_asm_source(_f, _n))
        globals()[f"TCC_{_f}_{_n}"] = tl.constexpr(tc_step_constraints(_f, _n))

LD4 = tl.constexpr(LD_W)
LDX = tl.constexpr(LD_X)
LD1 = tl.constexpr(LD_1)
LD2 = tl.constexpr(LD_2)
LDS = tl.constexpr(LD_F16)
SHF = tl.constexpr(SHFL_F16)   # SHFL_SCALES: a scale word from another lane of the row
LDR = tl.constexpr(LD_BF16)
ST16 = tl.constexpr(ST_16)
ST32 = tl.constexpr(ST_32)


@triton.jit
def _addr(p):
    return p.to(tl.int64, bitcast=True)


@triton.jit
def _ld4(p, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,l", [_addr(p)],
                                     dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _x_tile(x_ptr, col, T, sx, word0, kw_last):
    """Column `col`'s 4 x 16-byte loads (words word0 + 0..3 of x, clamped to the last word of K;
    columns >= T read column 0: finite, never stored)."""
    cc = tl.where(col < T, col, 0)
    row = x_ptr + cc * sx
    a0, a1, a2, a3 = _ld4(row + tl.minimum(word0 + 0, kw_last) * 8, LDX)
    b0, b1, b2, b3 = _ld4(row + tl.minimum(word0 + 1, kw_last) * 8, LDX)
    c0, c1, c2, c3 = _ld4(row + tl.minimum(word0 + 2, kw_last) * 8, LDX)
    d0, d1, d2, d3 = _ld4(row + tl.minimum(word0 + 3, kw_last) * 8, LDX)
    return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3)


@triton.jit
def _rows(base_ptr, high_ptr, scale_ptr, row, kb, ci, base_row, high_row, scale_row, FMT: tl.constexpr):
    """Row `row`'s chunk c of K step kb: 4 words, high words (unused copies for Q4), fp32 scale."""
    w0, w1, w2, w3, h0, h1 = _words(base_ptr, high_ptr, row, kb, ci, base_row, high_row, FMT)
    sp = scale_ptr + row * scale_row + kb * 2 + ci // 2
    s = tl.inline_asm_elementwise(LDS, "=f,l", [_addr(sp)], dtype=tl.float32, is_pure=True, pack=1)
    return w0, w1, w2, w3, h0, h1, s


@triton.jit
def _words(base_ptr, high_ptr, row, kb, ci, base_row, high_row, FMT: tl.constexpr):
    """Row `row`'s chunk c of K step kb without its scale (`_rows` adds it; SHFL_SCALES shuffles it):
    4 words, high words."""
    w0, w1, w2, w3 = _ld4(base_ptr + row * base_row + kb * 16 + ci * 4, LD4)
    if FMT == 5:
        h0 = tl.inline_asm_elementwise(LD1, "=r,l", [_addr(high_ptr + row * high_row + kb * 4 + ci)],
                                       dtype=tl.int32, is_pure=True, pack=1)
        h1 = h0
    elif FMT == 6:
        h0, h1 = tl.inline_asm_elementwise(LD2, "=r,=r,l", [_addr(high_ptr + row * high_row + kb * 8 + ci * 2)],
                                           dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        h0 = w0
        h1 = w0
    return w0, w1, w2, w3, h0, h1


@triton.jit
def _rows_async(base_ptr, high_ptr, scale_ptr, row, kb, ci, base_row, high_row, scale_row, FMT: tl.constexpr,
                NW: tl.constexpr):
    """`_rows` with plain loads (ASYNC: a loop Triton pipelines into a cp.async ring in shared memory): the
    4 words as one [NW, 8, 4, 4] load split into 4 [NW, 8, 4] tensors of the lanes' layout."""
    j = tl.arange(0, 4)[None, None, None, :]
    words = tl.load(base_ptr + (row * base_row + kb * 16 + ci * 4)[:, :, :, None] + j)
    even, odd = tl.split(tl.reshape(words, [NW, 8, 4, 2, 2]))  # word 2i + l: l = 0 / 1
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    s = tl.load(scale_ptr + row * scale_row + kb * 2 + ci // 2).to(tl.float32)
    if FMT == 5:
        h0 = tl.load(high_ptr + row * high_row + kb * 4 + ci)
        h1 = h0
    elif FMT == 6:
        h0 = tl.load(high_ptr + row * high_row + kb * 8 + ci * 2)
        h1 = tl.load(high_ptr + row * high_row + kb * 8 + ci * 2 + 1)
    else:
        h0 = w0
        h1 = w0
    return w0, w1, w2, w3, h0, h1, s


@triton.jit
def _scale_word(scale_ptr, row, kq, ci, scale_row, KB_TOTAL):
    """The 4 bytes (two f16 group scales) of K step kq + c of row `row` (clamped to the row's last
    step: a word past the split is loaded, never used)."""
    k = tl.minimum(kq + ci, KB_TOTAL - 1)
    return tl.inline_asm_elementwise(LD1, "=r,l", [_addr(scale_ptr + row * scale_row + k * 2)],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _scale_words(scale_ptr, rg, rh, up_off, kq, ci, scale_row, KB_TOTAL, EPI: tl.constexpr):
    """The scale words of K steps kq.. of the g / h rows and (EPI == 1) their up rows; without the up
    half, the up words are the g / h words."""
    wg = _scale_word(scale_ptr, rg, kq, ci, scale_row, KB_TOTAL)
    wh = _scale_word(scale_ptr, rh, kq, ci, scale_row, KB_TOTAL)
    wu = wg
    wv = wh
    if EPI == 1:
        wu = _scale_word(scale_ptr, rg + up_off, kq, ci, scale_row, KB_TOTAL)
        wv = _scale_word(scale_ptr, rh + up_off, kq, ci, scale_row, KB_TOTAL)
    return wg, wh, wu, wv


@triton.jit
def _shfl_scale(word, src, shift):
    """Step j's fp32 scale of this lane's row: lane src = 4 g + j's scale word, half c // 2."""
    return tl.inline_asm_elementwise(SHF, "=f,r,r,r", [word, src, shift], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _step(acc, wg, wh, xa, xb, FMT: tl.constexpr, N_TILES: tl.constexpr):
    """One asm call: acc (8-tuple, tiles 0 and 1) += this K step's products."""
    gw0, gw1, gw2, gw3, gh0, gh1, sg = wg
    hw0, hw1, hw2, hw3, hh0, hh1, sh = wh
    if FMT == 4:
        words = (gw0, gw1, gw2, gw3, hw0, hw1, hw2, hw3)
    elif FMT == 5:
        words = (gw0, gw1, gw2, gw3, gh0, hw0, hw1, hw2, hw3, hh0)
    else:
        words = (gw0, gw1, gw2, gw3, gh0, gh1, hw0, hw1, hw2, hw3, hh0, hh1)
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    if N_TILES == 1:
        args = (a0, a1, a2, a3) + words + (sg, sh) + xa
        if FMT == 4:
            r0, r1, r2, r3 = tl.inline_asm_elementwise(TC_4_1, TCC_4_1, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        elif FMT == 5:
            r0, r1, r2, r3 = tl.inline_asm_elementwise(TC_5_1, TCC_5_1, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            r0, r1, r2, r3 = tl.inline_asm_elementwise(TC_6_1, TCC_6_1, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        out = (r0, r1, r2, r3, a4, a5, a6, a7)
    else:
        args = (a0, a1, a2, a3, a4, a5, a6, a7) + words + (sg, sh) + xa + xb
        if FMT == 4:
            out = tl.inline_asm_elementwise(TC_4_2, TCC_4_2, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        elif FMT == 5:
            out = tl.inline_asm_elementwise(TC_5_2, TCC_5_2, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            out = tl.inline_asm_elementwise(TC_6_2, TCC_6_2, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    return out


@triton.jit
def _store(v, u, row, col, ok, out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr,
           EPI: tl.constexpr, SPLIT_K: tl.constexpr):
    """One accumulator register per lane: epilogue (or split-K partial) + predicated asm store."""
    col_c = tl.where(col < T, col, 0)
    row_c = tl.minimum(row, N_OUT - 1)
    if SPLIT_K == 1:
        if EPI == 1:
            val = v / (1.0 + tl.exp(-v)) * u
        elif EPI == 2:
            r = tl.inline_asm_elementwise(LDR, "=f,l", [_addr(res_ptr + col_c * sr + row_c)], dtype=tl.float32,
                                          is_pure=True, pack=1)
            val = v + r
        else:
            val = v
        bits = val.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        tl.inline_asm_elementwise(ST16, "=r,l,r,r", [_addr(out_ptr + col_c * so + row_c), ok.to(tl.int32), bits],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        if EPI == 1:
            cols = 2 * N_OUT
        else:
            cols = N_OUT
        p = ws_ptr + pid_k * T * cols + col_c * cols + row_c
        tl.inline_asm_elementwise(ST32, "=r,l,r,r", [_addr(p), ok.to(tl.int32), v.to(tl.int32, bitcast=True)],
                                  dtype=tl.int32, is_pure=False, pack=1)
        if EPI == 1:
            tl.inline_asm_elementwise(ST32, "=r,l,r,r", [_addr(p + N_OUT), ok.to(tl.int32),
                                                         u.to(tl.int32, bitcast=True)],
                                      dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gemv_tc_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr, cnt_ptr,
                   T, K, N_OUT, KB_TOTAL, base_row, high_row, scale_row, up_off, sx, so, sr, iters_per_split,
                   FMT: tl.constexpr, EPI: tl.constexpr, N_TILES: tl.constexpr, SPLIT_K: tl.constexpr,
                   NW: tl.constexpr, PREFETCH: tl.constexpr = False, FUSED_REDUCE: tl.constexpr = False,
                   SHFL_SCALES: tl.constexpr = False, ASYNC: tl.constexpr = 0, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    # [NW, 8, 4]: warp, g = lane // 4, c = lane % 4 (the mma fragment owners)
    wi = tl.arange(0, NW)[:, None, None]
    gi = tl.arange(0, 8)[None, :, None]
    ci = tl.arange(0, 4)[None, None, :]
    zero_i = wi * 0 + gi * 0 + ci * 0
    row_g = pid_n * 16 * NW + wi * 16 + gi + zero_i
    row_h = row_g + 8
    rg = tl.minimum(row_g, N_OUT - 1)
    rh = tl.minimum(row_h, N_OUT - 1)
    col0 = gi + zero_i
    ci3 = ci + zero_i
    kw_last = K // 8 - 1
    z = tl.zeros([NW, 8, 4], tl.float32)
    # accumulators as separate loop-carried values (tile 0: c0..c3, tile 1: c4..c7; up rows: u*)
    c0, c1, c2, c3, c4, c5, c6, c7 = z, z, z, z, z, z, z, z
    u0, u1, u2, u3, u4, u5, u6, u7 = z, z, z, z, z, z, z, z
    kb0 = pid_k * iters_per_split
    kb1 = tl.minimum(kb0 + iters_per_split, KB_TOTAL)
    if SHFL_SCALES:
        # the scales by 4 K steps: one coalesced 4-byte load per row and lane per group of 4 steps
        # (`_scale_word`), then a shuffle per step (`_shfl_scale`) instead of a 2-byte load per step
        src = gi * 4 + zero_i
        shift = (ci3 // 2) * 16
        if PREFETCH:
            kp = tl.minimum(kb0, KB_TOTAL - 1)
            g0, g1, g2, g3, g4, g5 = _words(base_ptr, high_ptr, rg, kp, ci3, base_row, high_row, FMT)
            h0, h1, h2, h3, h4, h5 = _words(base_ptr, high_ptr, rh, kp, ci3, base_row, high_row, FMT)
            p0, p1, p2, p3, p4, p5 = g0, g1, g2, g3, g4, g5
            q0, q1, q2, q3, q4, q5 = h0, h1, h2, h3, h4, h5
            if EPI == 1:
                p0, p1, p2, p3, p4, p5 = _words(base_ptr, high_ptr, rg + up_off, kp, ci3, base_row, high_row, FMT)
                q0, q1, q2, q3, q4, q5 = _words(base_ptr, high_ptr, rh + up_off, kp, ci3, base_row, high_row, FMT)
            sg_w, sh_w, su_w, sv_w = _scale_words(scale_ptr, rg, rh, up_off, kb0, ci3, scale_row, KB_TOTAL, EPI)
        for kq in range(kb0, kb1, 4):
            if PREFETCH:  # this group's scale words were loaded a group ago; the next group's now
                cg_w, ch_w, cu_w, cv_w = sg_w, sh_w, su_w, sv_w
                sg_w, sh_w, su_w, sv_w = _scale_words(scale_ptr, rg, rh, up_off, kq + 4, ci3, scale_row, KB_TOTAL,
                                                      EPI)
            else:
                cg_w, ch_w, cu_w, cv_w = _scale_words(scale_ptr, rg, rh, up_off, kq, ci3, scale_row, KB_TOTAL, EPI)
            for j in tl.static_range(4):
                kb = kq + j
                if kb < kb1:
                    if PREFETCH:
                        kn = tl.minimum(kb + 1, kb1 - 1)
                        ng = _words(base_ptr, high_ptr, rg, kn, ci3, base_row, high_row, FMT)
                        nh = _words(base_ptr, high_ptr, rh, kn, ci3, base_row, high_row, FMT)
                        nug = ng
                        nuh = nh
                        if EPI == 1:
                            nug = _words(base_ptr, high_ptr, rg + up_off, kn, ci3, base_row, high_row, FMT)
                            nuh = _words(base_ptr, high_ptr, rh + up_off, kn, ci3, base_row, high_row, FMT)
                        wg = (g0, g1, g2, g3, g4, g5)
                        wh = (h0, h1, h2, h3, h4, h5)
                        wu = (p0, p1, p2, p3, p4, p5)
                        wv = (q0, q1, q2, q3, q4, q5)
                    else:
                        wg = _words(base_ptr, high_ptr, rg, kb, ci3, base_row, high_row, FMT)
                        wh = _words(base_ptr, high_ptr, rh, kb, ci3, base_row, high_row, FMT)
                        wu = wg
                        wv = wh
                        if EPI == 1:
                            wu = _words(base_ptr, high_ptr, rg + up_off, kb, ci3, base_row, high_row, FMT)
                            wv = _words(base_ptr, high_ptr, rh + up_off, kb, ci3, base_row, high_row, FMT)
                    word0 = kb * 16 + ci3 * 4
                    xa = _x_tile(x_ptr, col0, T, sx, word0, kw_last)
                    xb = xa
                    if N_TILES == 2:
                        xb = _x_tile(x_ptr, col0 + 8, T, sx, word0, kw_last)
                    sg = _shfl_scale(cg_w, src + j, shift)
                    sh = _shfl_scale(ch_w, src + j, shift)
                    c0, c1, c2, c3, c4, c5, c6, c7 = _step((c0, c1, c2, c3, c4, c5, c6, c7), wg + (sg,), wh + (sh,),
                                                           xa, xb, FMT, N_TILES)
                    if EPI == 1:
                        su = _shfl_scale(cu_w, src + j, shift)
                        sv = _shfl_scale(cv_w, src + j, shift)
                        u0, u1, u2, u3, u4, u5, u6, u7 = _step((u0, u1, u2, u3, u4, u5, u6, u7), wu + (su,),
                                                               wv + (sv,), xa, xb, FMT, N_TILES)
                    if PREFETCH:
                        g0, g1, g2, g3, g4, g5 = ng
                        h0, h1, h2, h3, h4, h5 = nh
                        p0, p1, p2, p3, p4, p5 = nug
                        q0, q1, q2, q3, q4, q5 = nuh
    elif ASYNC > 0:
        # the weight chunks, scales and high words through an ASYNC-stage cp.async ring in shared memory
        # (plain loads Triton pipelines; the asm loads it cannot see)
        for kb in tl.range(kb0, kb1, num_stages=ASYNC):
            word0 = kb * 16 + ci3 * 4
            xa = _x_tile(x_ptr, col0, T, sx, word0, kw_last)
            xb = xa
            if N_TILES == 2:
                xb = _x_tile(x_ptr, col0 + 8, T, sx, word0, kw_last)
            wg = _rows_async(base_ptr, high_ptr, scale_ptr, rg, kb, ci3, base_row, high_row, scale_row, FMT, NW)
            wh = _rows_async(base_ptr, high_ptr, scale_ptr, rh, kb, ci3, base_row, high_row, scale_row, FMT, NW)
            c0, c1, c2, c3, c4, c5, c6, c7 = _step((c0, c1, c2, c3, c4, c5, c6, c7), wg, wh, xa, xb, FMT,
                                                   N_TILES)
            if EPI == 1:
                ug = _rows_async(base_ptr, high_ptr, scale_ptr, rg + up_off, kb, ci3, base_row, high_row, scale_row,
                                 FMT, NW)
                uh = _rows_async(base_ptr, high_ptr, scale_ptr, rh + up_off, kb, ci3, base_row, high_row, scale_row,
                                 FMT, NW)
                u0, u1, u2, u3, u4, u5, u6, u7 = _step((u0, u1, u2, u3, u4, u5, u6, u7), ug, uh, xa, xb, FMT,
                                                       N_TILES)
    elif PREFETCH:
        # register double buffer: the next K step's weight chunks and scales are requested before
        # this step's dequant + mma (inline-asm loads are invisible to Triton's pipeliner); the load
        # after the last step re-reads this program's last step (an L2 hit)
        kp = tl.minimum(kb0, KB_TOTAL - 1)
        g0, g1, g2, g3, g4, g5, g6 = _rows(base_ptr, high_ptr, scale_ptr, rg, kp, ci3, base_row, high_row,
                                           scale_row, FMT)
        h0, h1, h2, h3, h4, h5, h6 = _rows(base_ptr, high_ptr, scale_ptr, rh, kp, ci3, base_row, high_row,
                                           scale_row, FMT)
        p0, p1, p2, p3, p4, p5, p6 = g0, g1, g2, g3, g4, g5, g6
        q0, q1, q2, q3, q4, q5, q6 = h0, h1, h2, h3, h4, h5, h6
        if EPI == 1:
            p0, p1, p2, p3, p4, p5, p6 = _rows(base_ptr, high_ptr, scale_ptr, rg + up_off, kp, ci3, base_row,
                                               high_row, scale_row, FMT)
            q0, q1, q2, q3, q4, q5, q6 = _rows(base_ptr, high_ptr, scale_ptr, rh + up_off, kp, ci3, base_row,
                                               high_row, scale_row, FMT)
        for kb in range(kb0, kb1):
            kn = tl.minimum(kb + 1, kb1 - 1)
            ng = _rows(base_ptr, high_ptr, scale_ptr, rg, kn, ci3, base_row, high_row, scale_row, FMT)
            nh = _rows(base_ptr, high_ptr, scale_ptr, rh, kn, ci3, base_row, high_row, scale_row, FMT)
            nug = ng
            nuh = nh
            if EPI == 1:
                nug = _rows(base_ptr, high_ptr, scale_ptr, rg + up_off, kn, ci3, base_row, high_row, scale_row, FMT)
                nuh = _rows(base_ptr, high_ptr, scale_ptr, rh + up_off, kn, ci3, base_row, high_row, scale_row, FMT)
            word0 = kb * 16 + ci3 * 4
            xa = _x_tile(x_ptr, col0, T, sx, word0, kw_last)
            xb = xa
            if N_TILES == 2:
                xb = _x_tile(x_ptr, col0 + 8, T, sx, word0, kw_last)
            c0, c1, c2, c3, c4, c5, c6, c7 = _step((c0, c1, c2, c3, c4, c5, c6, c7), (g0, g1, g2, g3, g4, g5, g6),
                                                   (h0, h1, h2, h3, h4, h5, h6), xa, xb, FMT, N_TILES)
            if EPI == 1:
                u0, u1, u2, u3, u4, u5, u6, u7 = _step((u0, u1, u2, u3, u4, u5, u6, u7),
                                                       (p0, p1, p2, p3, p4, p5, p6), (q0, q1, q2, q3, q4, q5, q6),
                                                       xa, xb, FMT, N_TILES)
            g0, g1, g2, g3, g4, g5, g6 = ng
            h0, h1, h2, h3, h4, h5, h6 = nh
            p0, p1, p2, p3, p4, p5, p6 = nug
            q0, q1, q2, q3, q4, q5, q6 = nuh
    else:
        for kb in range(kb0, kb1):
            word0 = kb * 16 + ci3 * 4
            xa = _x_tile(x_ptr, col0, T, sx, word0, kw_last)
            xb = xa
            if N_TILES == 2:
                xb = _x_tile(x_ptr, col0 + 8, T, sx, word0, kw_last)
            wg = _rows(base_ptr, high_ptr, scale_ptr, rg, kb, ci3, base_row, high_row, scale_row, FMT)
            wh = _rows(base_ptr, high_ptr, scale_ptr, rh, kb, ci3, base_row, high_row, scale_row, FMT)
            c0, c1, c2, c3, c4, c5, c6, c7 = _step((c0, c1, c2, c3, c4, c5, c6, c7), wg, wh, xa, xb, FMT,
                                                   N_TILES)
            if EPI == 1:
                ug = _rows(base_ptr, high_ptr, scale_ptr, rg + up_off, kb, ci3, base_row, high_row, scale_row,
                           FMT)
                uh = _rows(base_ptr, high_ptr, scale_ptr, rh + up_off, kb, ci3, base_row, high_row, scale_row,
                           FMT)
                u0, u1, u2, u3, u4, u5, u6, u7 = _step((u0, u1, u2, u3, u4, u5, u6, u7), ug, uh, xa, xb, FMT,
                                                       N_TILES)
    # fragment: register i of tile t = out[row (g if i < 2 else g + 8)][column 8 t + 2 c + (i % 2)]
    mg = row_g < N_OUT
    mh = row_h < N_OUT
    ca = ci3 * 2
    _store(c0, u0, row_g, ca, mg & (ca < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    _store(c1, u1, row_g, ca + 1, mg & (ca + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    _store(c2, u2, row_h, ca, mh & (ca < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    _store(c3, u3, row_h, ca + 1, mh & (ca + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    if N_TILES == 2:
        cb = ca + 8
        _store(c4, u4, row_g, cb, mg & (cb < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
        _store(c5, u5, row_g, cb + 1, mg & (cb + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI,
               SPLIT_K)
        _store(c6, u6, row_h, cb, mh & (cb < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
        _store(c7, u7, row_h, cb + 1, mh & (cb + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI,
               SPLIT_K)
    if SPLIT_K > 1:
        if FUSED_REDUCE:
            splitk_fixup(ws_ptr, cnt_ptr, out_ptr, res_ptr, pid_n, pid_n * 16 * NW, T, N_OUT, so, sr,
                         SPLIT_K, EPI, 16 * NW, 16, False)


# ---------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------
def _route(name):
    from .routes import TC_ROUTES
    route = TC_ROUTES.get(name)
    if route is None:
        raise RouteError(f"unknown tensor-core GEMV route {name!r}")
    return route


def launch_tc(route_name: str, x, weight, out, *, epilogue: str = "none", residual=None, workspace=None,
              params=None) -> None:
    route = _route(route_name)
    if not isinstance(weight, QuantWeight):
        raise RouteError(f"route {route.name}: weight must be a row-split QuantWeight, got {type(weight).__name__}")
    fmt, n, k, T, n_out, p = check_call(route, x, weight, out, epilogue, residual, params)
    if T > MAX_T:
        # one pass serves at most MAX_T columns (two m16n8 column tiles): wider T (the route's domain
        # goes to 32) runs in slices of MAX_T columns, each streaming the weights again — the tuner
        # weighs that against the tiled schedules (at T=16 one pass took 55 µs for gate_up on the
        # H200, small_t_mma 194 µs at T=32)
        for c0 in range(0, T, MAX_T):
            c1 = min(T, c0 + MAX_T)
            launch_tc(route_name, x[c0:c1], weight, out[c0:c1], epilogue=epilogue,
                      residual=None if residual is None else residual[c0:c1], workspace=workspace, params=params)
        return None
    code = _FMT_CODE[fmt]
    use_asm = p["USE_ASM"]
    if use_asm is True and not asm_supported(x.device):
        raise RouteError(f"route {route.name}: USE_ASM=True needs a CUDA sm_90+ device outside the Triton interpreter")
    aligned = (k % 8 == 0 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
               and weight.words().data_ptr() % 16 == 0 and weight.scales().data_ptr() % 2 == 0
               and (code != 6 or weight.high_words().data_ptr() % 8 == 0))
    use_asm = aligned and (use_asm is True or (use_asm == "auto" and asm_supported(x.device)))
    if p["ASYNC"] and (p["PREFETCH"] or p["SCALES"] == "shfl"):
        raise RouteError(f"route {route.name}: ASYNC={p['ASYNC']} replaces the register prefetch and loads the "
                         f"scales with the weights: PREFETCH must be false and SCALES lane with it")
    # the 4-byte scale-word loads need 4-byte aligned scale rows (groups per row even: k_pad % 128 == 0)
    shfl = p["SCALES"] == "shfl" and weight.scales().data_ptr() % 4 == 0 and weight.groups_per_row % 2 == 0
    if not use_asm:
        # same math (dequantized bf16 weights, fp32 accumulation) through the tiled tensor-core kernel
        from .launch import launch
        fb = {"BLOCK_T": 16, "SPLIT_K": p["SPLIT_K"], "USE_ASM": False}
        return launch(f"q{code}_small_t_mma", x, weight, out, epilogue=epilogue, residual=residual,
                      workspace=workspace, params=fb)
    res = residual if epilogue == "residual" else out
    split_k = p["SPLIT_K"]
    ws = splitk_workspace(route, split_k, T, n_out, epilogue, workspace, out)
    nw = p["num_warps"]
    fused = split_k > 1 and p["REDUCE"] == "fused" and triton.cdiv(n_out, 16 * nw) <= FIXUP_COUNTERS
    cnt = fixup_counters(out) if fused else out
    kb_total = weight.k_pad // 128
    ips = triton.cdiv(kb_total, split_k)
    grid = (triton.cdiv(n_out, 16 * nw), split_k)
    epi = EPI_CODES[epilogue]
    gemv_tc_kernel[grid](
        x, weight.words(), weight.high_words(), weight.scales(), out, res, ws, cnt,
        T, k, n_out, kb_total, weight.base_row_bytes // 4, weight.high_row_bytes // 4, weight.groups_per_row,
        n_out, x.stride(0), out.stride(0), res.stride(0), ips,
        FMT=code, EPI=epi, N_TILES=1 if T <= 8 else 2, SPLIT_K=split_k, NW=nw, PREFETCH=bool(p["PREFETCH"]),
        FUSED_REDUCE=fused, SHFL_SCALES=shfl, ASYNC=p["ASYNC"], num_warps=nw, num_stages=1, **({"maxnreg": p["MAXNREG"]} if p["MAXNREG"] else {}), **pdl_launch(gemv_tc_kernel))
    if not fused:
        reduce_split_k(ws, out, res, T, n_out, split_k, epi)
    return None


q4_gemv_tc = named_launcher(launch_tc, "q4_gemv_tc", "Launch tensor-core GEMV route `q4_gemv_tc`.")
q5_gemv_tc = named_launcher(launch_tc, "q5_gemv_tc", "Launch tensor-core GEMV route `q5_gemv_tc`.")
q6_gemv_tc = named_launcher(launch_tc, "q6_gemv_tc", "Launch tensor-core GEMV route `q6_gemv_tc`.")
