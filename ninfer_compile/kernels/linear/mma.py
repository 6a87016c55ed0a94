"""Tensor-core schedules (small-T and wide-T prefill): tl.dot on dequantized bf16 tiles.

acc[BLOCK_N, BLOCK_T] += W_hat[rows, k-tile] (bf16, dequantized in registers: the wgmma A operand
may live in registers) @ x[t-tile, k-tile]^T. The grid is (N blocks x T blocks, SPLIT_K) with
the T block fastest, so the programs sharing one weight tile run together and hit L2. The
small-T route uses BLOCK_T 16/32/64 (usually one T block), the wide route 64..256 with deeper
pipelining. The per-group scale is folded into the bf16 weight (W_hat rounded to bf16 once).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dequant import dequant_tile
from .epilogue import store_epilogue, store_partial
from ..pdl import pdl_enter


@triton.jit
def _mma(a, b, acc, DOT_F32: tl.constexpr):
    # DOT_F32: the Triton interpreter (3.9) multiplies the raw uint16 bits of bf16 dot operands;
    # under it the same products are formed in exact fp32 instead (bf16 values are exact in fp32).
    if DOT_F32:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def qlinear_mma_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr,
                       T, K, K_LOOP, N_OUT, KW_TOTAL, base_row, high_row, scale_row, up_off,
                       sx, so, sr, iters_per_split,
                       FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT_K: tl.constexpr,
                       USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    ntb = tl.cdiv(T, BLOCK_T)
    pid_n = pid // ntb
    pid_t = pid % ntb
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N_OUT
    ts = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = ts < T
    acc = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    n_iters = tl.cdiv(K_LOOP, BLOCK_K)
    it0 = pid_k * iters_per_split
    it1 = tl.minimum(it0 + iters_per_split, n_iters)
    for it in range(it0, it1):
        k0 = it * BLOCK_K
        kk = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + ts[None, :] * sx + kk[:, None],
                     mask=(kk < K)[:, None] & tmask[None, :], other=0.0)
        wt = dequant_tile(base_ptr, high_ptr, scale_ptr, rows, rmask, k0, K, KW_TOTAL,
                          base_row, high_row, scale_row, FMT, BLOCK_N, BLOCK_K, USE_ASM, DOT_F32)
        acc = _mma(wt, xt, acc, DOT_F32)
        if EPI == 1:
            wu = dequant_tile(base_ptr, high_ptr, scale_ptr, rows + up_off, rmask, k0, K, KW_TOTAL,
                              base_row, high_row, scale_row, FMT, BLOCK_N, BLOCK_K, USE_ASM, DOT_F32)
            acc_u = _mma(wu, xt, acc_u, DOT_F32)
    t_idx = ts[None, :]
    n_idx = rows[:, None]
    mask = rmask[:, None] & tmask[None, :]
    if SPLIT_K == 1:
        store_epilogue(acc, acc_u, t_idx, n_idx, mask, out_ptr, res_ptr, so, sr, EPI, DOT_F32)
    else:
        store_partial(acc, acc_u, t_idx, n_idx, mask, ws_ptr, pid_k, T, N_OUT, EPI)
