"""Shared epilogue / split-K helpers for the linear kernels.

EPI codes (constexpr): 0 = none, 1 = swiglu (gate rows [0, N_OUT), up rows [N_OUT, 2 N_OUT);
out = silu(gate) * up), 2 = residual (out = residual + acc). Index tensors are broadcastable, so
the same helpers serve [T, N] (GEMV) and [N, T] (tensor-core) accumulator orientations.

Split-K is deterministic two-phase: each split stores fp32 partials into the caller's workspace
`ws[SPLIT_K, T, WS_COLS]` (WS_COLS = 2 N_OUT for swiglu: gate then up), and
`splitk_reduce_kernel` sums them in split order and applies the epilogue. No atomics.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ..pdl import pdl_enter

EPI_CODES = {"none": 0, "swiglu": 1, "residual": 2}


@triton.jit
def store_epilogue(g, u, t_idx, n_idx, mask, out_ptr, res_ptr, so, sr, EPI: tl.constexpr,
                   INTERP: tl.constexpr = False):
    if EPI == 1:
        val = g / (1.0 + tl.exp(-g)) * u
    elif EPI == 2:
        r = tl.load(res_ptr + t_idx * sr + n_idx, mask=mask, other=0.0).to(tl.float32)
        val = g + r
    else:
        val = g
    if INTERP:  # the interpreter truncates fp32 -> bf16: round to nearest even on the bits first
        b = val.to(tl.uint32, bitcast=True)
        val = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    tl.store(out_ptr + t_idx * so + n_idx, val.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_partial(g, u, t_idx, n_idx, mask, ws_ptr, pid_k, T, N_OUT, EPI: tl.constexpr):
    if EPI == 1:
        ws_cols = 2 * N_OUT
    else:
        ws_cols = N_OUT
    p = ws_ptr + pid_k * T * ws_cols + t_idx * ws_cols + n_idx
    tl.store(p, g, mask=mask)
    if EPI == 1:
        tl.store(p + N_OUT, u, mask=mask)


@triton.jit
def splitk_reduce_kernel(ws_ptr, out_ptr, res_ptr, T, N_OUT, so, sr,
                         SPLIT_K: tl.constexpr, EPI: tl.constexpr, BLOCK: tl.constexpr,
                         INTERP: tl.constexpr = False, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    m = idx < T * N_OUT
    t = idx // N_OUT
    n = idx % N_OUT
    if EPI == 1:
        ws_cols = 2 * N_OUT
    else:
        ws_cols = N_OUT
    g = tl.zeros([BLOCK], tl.float32)
    u = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        p = ws_ptr + s * T * ws_cols + t * ws_cols + n
        g += tl.load(p, mask=m, other=0.0)
        if EPI == 1:
            u += tl.load(p + N_OUT, mask=m, other=0.0)
    store_epilogue(g, u, t, n, m, out_ptr, res_ptr, so, sr, EPI, INTERP)
