"""Decode GEMV schedule (T <= 4): CUDA-core fp32 FMAs, columns held in registers.

One program owns BLOCK_N output rows (and, for swiglu, the matching up rows) and walks K in
BLOCK_K steps (optionally one of SPLIT_K K-ranges, deterministic two-phase reduce). Everything
is a 2-D [BLOCK_N, KW] tile of 32-bit words (KW = BLOCK_K / lanes-per-word), so each thread owns
whole words (vector loads) and unpacks all of a word's lanes in registers: lane j of every word
is its own [BLOCK_N, KW] tensor (magic-number conversion, no I2F), multiplied by the matching
activation x[t, LPW*w + j] (a strided [KW] vector, L1-resident), summed over the word's lanes and
scaled once per word by its group scale. The KW axis is reduced once after the loop.
BLOCK_T = next_pow2(T) is a compile-time constant and columns >= T are masked: the kernel
computes exactly T columns (never one column's work for T).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dequant import XOR_Q4, XOR_W8, magic_f32
from .epilogue import store_epilogue, store_partial
from .ptx import LD_X, q4_word_asm_source, q4_word_constraints
from ..pdl import pdl_enter


# USE_ASM (Q4, sm_90+, not under the interpreter): one asm instance per 32-bit word of one row, all
# BLOCK_T columns at once (ptx.q4_word_asm_source: packed bf16x2 dequant + bf16x2 dot products).
Q4_GEMV_ASM1 = tl.constexpr(q4_word_asm_source(1))
Q4_GEMV_ASM2 = tl.constexpr(q4_word_asm_source(2))
Q4_GEMV_ASM4 = tl.constexpr(q4_word_asm_source(4))
_C1 = tl.constexpr(q4_word_constraints(1))
_C2 = tl.constexpr(q4_word_constraints(2))
_C4 = tl.constexpr(q4_word_constraints(4))
# one 16-byte load of a word's 8 activations, as an elementwise asm over the [KW] word vector so
# that it keeps the weight tile's (sliced) layout: no layout conversion, one load per thread and
# word, shared by every row the thread holds
X_LD_ASM = tl.constexpr(LD_X)


@triton.jit
def _xpairs(x_ptr, t, sx, wc, T, shape):
    """Column t's 4 natural bf16 pairs of every word as int32, broadcast to [BN, KW]. Columns >= T
    read column 0 and words past K read the last word (finite values; their products are
    discarded: such columns are never stored, such words have code 0)."""
    tt = tl.where(t < T, t, 0)
    a = (x_ptr + tt * sx + wc * 8).to(tl.int64, bitcast=True)
    p0, p1, p2, p3 = tl.inline_asm_elementwise(X_LD_ASM, "=r,=r,=r,=r,l", [a],
                                               dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                               is_pure=True, pack=1)
    return (tl.broadcast_to(p0[None, :], shape), tl.broadcast_to(p1[None, :], shape),
            tl.broadcast_to(p2[None, :], shape), tl.broadcast_to(p3[None, :], shape))


@triton.jit
def _accumulate_q4_asm(acc0, acc1, acc2, acc3, x_ptr, base_ptr, scale_ptr, rows, rmask, wi, wmask,
                       K, T, sx, base_row, scale_row, BLOCK_T: tl.constexpr):
    m = rmask[:, None] & wmask[None, :]
    w = tl.load(base_ptr + rows[:, None] * base_row + wi[None, :], mask=m, other=0)
    s = tl.load(scale_ptr + rows[:, None] * scale_row + (wi // 8)[None, :], mask=m, other=0.0).to(tl.float32)
    wc = tl.minimum(wi, K // 8 - 1)
    a0, a1, a2, a3 = _xpairs(x_ptr, 0, sx, wc, T, w.shape)
    if BLOCK_T == 1:
        o0 = tl.inline_asm_elementwise(Q4_GEMV_ASM1, _C1, [w, a0, a1, a2, a3], dtype=tl.float32,
                                       is_pure=True, pack=1)
        acc0 += o0 * s
    elif BLOCK_T == 2:
        b0, b1, b2, b3 = _xpairs(x_ptr, 1, sx, wc, T, w.shape)
        o0, o1 = tl.inline_asm_elementwise(Q4_GEMV_ASM2, _C2, [w, a0, a1, a2, a3, b0, b1, b2, b3],
                                           dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        acc0 += o0 * s
        acc1 += o1 * s
    else:
        b0, b1, b2, b3 = _xpairs(x_ptr, 1, sx, wc, T, w.shape)
        c0, c1, c2, c3 = _xpairs(x_ptr, 2, sx, wc, T, w.shape)
        d0, d1, d2, d3 = _xpairs(x_ptr, 3, sx, wc, T, w.shape)
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            Q4_GEMV_ASM4, _C4, [w, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        acc0 += o0 * s
        acc1 += o1 * s
        acc2 += o2 * s
        acc3 += o3 * s
    return acc0, acc1, acc2, acc3


@triton.jit
def _col(l0, l1, l2, l3, l4, l5, l6, l7, x_ptr, t, sx, wi, K, T, LPW: tl.constexpr):
    """sum_j lane_j * x[t, LPW*w + j]: x is loaded once per word as a contiguous [KW, LPW] tile
    (one vector load per word) and split into its lanes in registers."""
    j = tl.arange(0, LPW)
    kk = wi[:, None] * LPW + j[None, :]
    xw = tl.load(x_ptr + t * sx + kk, mask=(kk < K) & ((kk * 0 + t) < T), other=0.0).to(tl.float32)
    KW: tl.constexpr = xw.shape[0]
    if LPW == 8:
        ev, od = tl.split(tl.reshape(xw, (KW, 4, 2)))          # lanes 0,2,4,6 | 1,3,5,7
        e04, e26 = tl.split(tl.reshape(ev, (KW, 2, 2)))        # lanes 0,4 | 2,6
        o15, o37 = tl.split(tl.reshape(od, (KW, 2, 2)))        # lanes 1,5 | 3,7
        x0, x4 = tl.split(e04)
        x2, x6 = tl.split(e26)
        x1, x5 = tl.split(o15)
        x3, x7 = tl.split(o37)
        p = l0 * x0[None, :] + l1 * x1[None, :] + l2 * x2[None, :] + l3 * x3[None, :]
        p += l4 * x4[None, :] + l5 * x5[None, :] + l6 * x6[None, :] + l7 * x7[None, :]
    else:
        ev, od = tl.split(tl.reshape(xw, (KW, 2, 2)))          # lanes 0,2 | 1,3
        x0, x2 = tl.split(ev)
        x1, x3 = tl.split(od)
        p = l0 * x0[None, :] + l1 * x1[None, :] + l2 * x2[None, :] + l3 * x3[None, :]
    return p


@triton.jit
def _lanes(base_ptr, high_ptr, scale_ptr, rows, rmask, wi, wmask, base_row, high_row, scale_row,
           FMT: tl.constexpr):
    """fp32 codes of the 8 (W8: 4; l4..l7 = l0..l3, unused) lanes of every word + word scales."""
    m = rmask[:, None] & wmask[None, :]
    w = tl.load(base_ptr + rows[:, None] * base_row + wi[None, :], mask=m, other=0)
    s = tl.load(scale_ptr + rows[:, None] * scale_row + (wi // 8)[None, :], mask=m, other=0.0).to(tl.float32)
    if FMT == 8:
        wx = w ^ XOR_W8
        l0 = magic_f32(wx & 0xFF, 128)
        l1 = magic_f32((wx >> 8) & 0xFF, 128)
        l2 = magic_f32((wx >> 16) & 0xFF, 128)
        l3 = magic_f32((wx >> 24) & 0xFF, 128)
        l4 = l0
        l5 = l1
        l6 = l2
        l7 = l3
    elif FMT == 4:
        wx = w ^ XOR_Q4
        l0 = magic_f32(wx & 0xF, 8)
        l1 = magic_f32((wx >> 4) & 0xF, 8)
        l2 = magic_f32((wx >> 8) & 0xF, 8)
        l3 = magic_f32((wx >> 12) & 0xF, 8)
        l4 = magic_f32((wx >> 16) & 0xF, 8)
        l5 = magic_f32((wx >> 20) & 0xF, 8)
        l6 = magic_f32((wx >> 24) & 0xF, 8)
        l7 = magic_f32((wx >> 28) & 0xF, 8)
    else:
        if FMT == 5:
            h = tl.load(high_ptr + rows[:, None] * high_row + (wi // 4)[None, :], mask=m, other=0)
            # the word's 8 high bits, moved to bit 4 of lane j by (hb >> j) << 4
            hb = (h >> ((wi % 4) * 8)[None, :]) ^ 0xFF    # ^: offset binary (q + 16)
            l0 = magic_f32((w & 0xF) | ((hb & 1) << 4), 16)
            l1 = magic_f32(((w >> 4) & 0xF) | ((hb & 2) << 3), 16)
            l2 = magic_f32(((w >> 8) & 0xF) | ((hb & 4) << 2), 16)
            l3 = magic_f32(((w >> 12) & 0xF) | ((hb & 8) << 1), 16)
            l4 = magic_f32(((w >> 16) & 0xF) | (hb & 16), 16)
            l5 = magic_f32(((w >> 20) & 0xF) | ((hb >> 1) & 16), 16)
            l6 = magic_f32(((w >> 24) & 0xF) | ((hb >> 2) & 16), 16)
            l7 = magic_f32(((w >> 28) & 0xF) | ((hb >> 3) & 16), 16)
        else:
            h = tl.load(high_ptr + rows[:, None] * high_row + (wi // 2)[None, :], mask=m, other=0)
            hb = (h >> ((wi % 2) * 16)[None, :]) ^ 0xAAAA  # bit 5 of every lane flipped: q + 32
            l0 = magic_f32((w & 0xF) | ((hb & 3) << 4), 32)
            l1 = magic_f32(((w >> 4) & 0xF) | ((hb << 2) & 48), 32)
            l2 = magic_f32(((w >> 8) & 0xF) | (hb & 48), 32)
            l3 = magic_f32(((w >> 12) & 0xF) | ((hb >> 2) & 48), 32)
            l4 = magic_f32(((w >> 16) & 0xF) | ((hb >> 4) & 48), 32)
            l5 = magic_f32(((w >> 20) & 0xF) | ((hb >> 6) & 48), 32)
            l6 = magic_f32(((w >> 24) & 0xF) | ((hb >> 8) & 48), 32)
            l7 = magic_f32(((w >> 28) & 0xF) | ((hb >> 10) & 48), 32)
    return l0, l1, l2, l3, l4, l5, l6, l7, s


@triton.jit
def _accumulate(acc0, acc1, acc2, acc3, x_ptr, base_ptr, high_ptr, scale_ptr, rows, rmask, wi, wmask,
                K, T, sx, base_row, high_row, scale_row, FMT: tl.constexpr, BLOCK_T: tl.constexpr):
    LPW: tl.constexpr = 4 if FMT == 8 else 8
    l0, l1, l2, l3, l4, l5, l6, l7, s = _lanes(base_ptr, high_ptr, scale_ptr, rows, rmask, wi, wmask,
                                               base_row, high_row, scale_row, FMT)
    acc0 += _col(l0, l1, l2, l3, l4, l5, l6, l7, x_ptr, 0, sx, wi, K, T, LPW) * s
    if BLOCK_T > 1:
        acc1 += _col(l0, l1, l2, l3, l4, l5, l6, l7, x_ptr, 1, sx, wi, K, T, LPW) * s
    if BLOCK_T > 2:
        acc2 += _col(l0, l1, l2, l3, l4, l5, l6, l7, x_ptr, 2, sx, wi, K, T, LPW) * s
        acc3 += _col(l0, l1, l2, l3, l4, l5, l6, l7, x_ptr, 3, sx, wi, K, T, LPW) * s
    return acc0, acc1, acc2, acc3


@triton.jit
def _xvec(row_ptr, kk, mask):
    """fp32 x[kk] of one column."""
    return tl.load(row_ptr + kk, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _accumulate_bf16(acc0, acc1, acc2, acc3, x_ptr, w_ptr, rows, rmask, kk, K, T, sx, w_row,
                     BLOCK_T: tl.constexpr):
    kmask = kk < K
    w = tl.load(w_ptr + rows[:, None] * w_row + kk[None, :], mask=rmask[:, None] & kmask[None, :],
                other=0.0).to(tl.float32)
    acc0 += w * _xvec(x_ptr, kk, kmask)[None, :]
    if BLOCK_T > 1:
        acc1 += w * _xvec(x_ptr + sx, kk, kmask & ((kk * 0 + 1) < T))[None, :]
    if BLOCK_T > 2:
        acc2 += w * _xvec(x_ptr + 2 * sx, kk, kmask & ((kk * 0 + 2) < T))[None, :]
        acc3 += w * _xvec(x_ptr + 3 * sx, kk, kmask & ((kk * 0 + 3) < T))[None, :]
    return acc0, acc1, acc2, acc3


@triton.jit
def _finish(acc0, acc1, acc2, acc3, u0, u1, u2, u3, rows, rmask, T, N_OUT, out_ptr, res_ptr, ws_ptr,
            so, sr, pid_k, EPI: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_T: tl.constexpr,
            INTERP: tl.constexpr):
    for t in tl.static_range(BLOCK_T):
        if t == 0:
            g = tl.sum(acc0, axis=1)
            u = tl.sum(u0, axis=1)
        elif t == 1:
            g = tl.sum(acc1, axis=1)
            u = tl.sum(u1, axis=1)
        elif t == 2:
            g = tl.sum(acc2, axis=1)
            u = tl.sum(u2, axis=1)
        else:
            g = tl.sum(acc3, axis=1)
            u = tl.sum(u3, axis=1)
        mask = rmask & ((rows * 0 + t) < T)
        if SPLIT_K == 1:
            store_epilogue(g, u, t, rows, mask, out_ptr, res_ptr, so, sr, EPI, INTERP)
        else:
            store_partial(g, u, t, rows, mask, ws_ptr, pid_k, T, N_OUT, EPI)


@triton.jit
def qlinear_gemv_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr,
                        T, K, N_OUT, KW_TOTAL, base_row, high_row, scale_row, up_off,
                        sx, so, sr, iters_per_split,
                        FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT_K: tl.constexpr,
                        INTERP: tl.constexpr = False, USE_ASM: tl.constexpr = False,
                        PDL: tl.constexpr = False):
    pdl_enter(PDL)
    tl.static_assert(BLOCK_T <= 4)
    LPW: tl.constexpr = 4 if FMT == 8 else 8
    KW: tl.constexpr = BLOCK_K // LPW
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N_OUT
    if FMT == 16:
        zero = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    else:
        zero = tl.zeros([BLOCK_N, KW], tl.float32)
    a0 = zero
    a1 = zero
    a2 = zero
    a3 = zero
    u0 = zero
    u1 = zero
    u2 = zero
    u3 = zero
    if FMT == 16:
        n_iters = tl.cdiv(K, BLOCK_K)
    else:
        n_iters = tl.cdiv(KW_TOTAL, KW)
    it0 = pid_k * iters_per_split
    it1 = tl.minimum(it0 + iters_per_split, n_iters)
    for it in range(it0, it1):
        if FMT == 16:
            kk = it * BLOCK_K + tl.arange(0, BLOCK_K)
            a0, a1, a2, a3 = _accumulate_bf16(a0, a1, a2, a3, x_ptr, base_ptr, rows, rmask, kk, K, T,
                                              sx, base_row, BLOCK_T)
            if EPI == 1:
                u0, u1, u2, u3 = _accumulate_bf16(u0, u1, u2, u3, x_ptr, base_ptr, rows + up_off, rmask,
                                                  kk, K, T, sx, base_row, BLOCK_T)
        else:
            wi = it * KW + tl.arange(0, KW)
            wmask = wi < KW_TOTAL
            if USE_ASM and FMT == 4:
                a0, a1, a2, a3 = _accumulate_q4_asm(a0, a1, a2, a3, x_ptr, base_ptr, scale_ptr, rows,
                                                    rmask, wi, wmask, K, T, sx, base_row, scale_row,
                                                    BLOCK_T)
                if EPI == 1:
                    u0, u1, u2, u3 = _accumulate_q4_asm(u0, u1, u2, u3, x_ptr, base_ptr, scale_ptr,
                                                        rows + up_off, rmask, wi, wmask, K, T, sx,
                                                        base_row, scale_row, BLOCK_T)
            else:
                a0, a1, a2, a3 = _accumulate(a0, a1, a2, a3, x_ptr, base_ptr, high_ptr, scale_ptr, rows,
                                             rmask, wi, wmask, K, T, sx, base_row, high_row, scale_row,
                                             FMT, BLOCK_T)
                if EPI == 1:
                    u0, u1, u2, u3 = _accumulate(u0, u1, u2, u3, x_ptr, base_ptr, high_ptr, scale_ptr,
                                                 rows + up_off, rmask, wi, wmask, K, T, sx, base_row,
                                                 high_row, scale_row, FMT, BLOCK_T)
    _finish(a0, a1, a2, a3, u0, u1, u2, u3, rows, rmask, T, N_OUT, out_ptr, res_ptr, ws_ptr, so, sr,
            pid_k, EPI, SPLIT_K, BLOCK_T, INTERP)
