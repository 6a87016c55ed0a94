"""Decode GEMV schedule (T <= 4): CUDA-core fp32 FMAs, columns held in registers.

One program owns BLOCK_N output rows (and, for swiglu, the matching up rows) and walks K in
BLOCK_K steps (optionally one of SPLIT_K K-ranges, deterministic two-phase reduce). The tile is
[BLOCK_T, BLOCK_N, KW, LPW]: codes are unpacked from 32-bit words with the magic-number trick
(no I2F), multiplied by the activations, summed over the word's lanes, then scaled once per
word by the group scale; the KW axis is reduced once after the loop. BLOCK_T = next_pow2(T) is
a compile-time constant: the kernel computes exactly T columns (never one column's work for T).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dequant import codes3d, scales2d
from .epilogue import store_epilogue, store_partial


@triton.jit
def _gemv_partial(x_ptr, base_ptr, high_ptr, scale_ptr, rows, rmask, xv, wi, wmask, kk, K,
                  base_row, high_row, scale_row, FMT: tl.constexpr):
    if FMT == 16:
        wv = tl.load(base_ptr + rows[:, None, None] * base_row + kk[None, :, :],
                     mask=rmask[:, None, None] & (kk < K)[None, :, :], other=0.0).to(tl.float32)
        p = tl.sum(wv[None, :, :, :] * xv[:, None, :, :], axis=3)
    else:
        q = codes3d(base_ptr, high_ptr, rows, rmask, wi, wmask, base_row, high_row, FMT)
        s = scales2d(scale_ptr, rows, rmask, wi, wmask, scale_row)
        p = tl.sum(q[None, :, :, :] * xv[:, None, :, :], axis=3) * s[None, :, :]
    return p


@triton.jit
def qlinear_gemv_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr,
                        T, K, N_OUT, KW_TOTAL, base_row, high_row, scale_row, up_off,
                        sx, so, sr, iters_per_split,
                        FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT_K: tl.constexpr):
    LPW: tl.constexpr = 4 if FMT == 8 else 8
    KW: tl.constexpr = BLOCK_K // LPW
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N_OUT
    tt = tl.arange(0, BLOCK_T)
    tmask = tt < T
    j = tl.arange(0, LPW)
    acc = tl.zeros([BLOCK_T, BLOCK_N, KW], tl.float32)
    acc_u = tl.zeros([BLOCK_T, BLOCK_N, KW], tl.float32)
    n_iters = tl.cdiv(KW_TOTAL, KW)
    it0 = pid_k * iters_per_split
    it1 = tl.minimum(it0 + iters_per_split, n_iters)
    for it in range(it0, it1):
        wi = it * KW + tl.arange(0, KW)
        wmask = wi < KW_TOTAL
        kk = wi[:, None] * LPW + j[None, :]
        xv = tl.load(x_ptr + tt[:, None, None] * sx + kk[None, :, :],
                     mask=tmask[:, None, None] & (kk < K)[None, :, :], other=0.0).to(tl.float32)
        acc += _gemv_partial(x_ptr, base_ptr, high_ptr, scale_ptr, rows, rmask, xv, wi, wmask, kk,
                             K, base_row, high_row, scale_row, FMT)
        if EPI == 1:
            acc_u += _gemv_partial(x_ptr, base_ptr, high_ptr, scale_ptr, rows + up_off, rmask, xv,
                                   wi, wmask, kk, K, base_row, high_row, scale_row, FMT)
    g = tl.sum(acc, axis=2)      # [BLOCK_T, BLOCK_N]
    u = tl.sum(acc_u, axis=2)
    t_idx = tt[:, None]
    n_idx = rows[None, :]
    mask = tmask[:, None] & rmask[None, :]
    if SPLIT_K == 1:
        store_epilogue(g, u, t_idx, n_idx, mask, out_ptr, res_ptr, so, sr, EPI)
    else:
        store_partial(g, u, t_idx, n_idx, mask, ws_ptr, pid_k, T, N_OUT, EPI)
