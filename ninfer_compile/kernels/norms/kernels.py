"""Triton kernels of the norm family.

One program normalises one row (a token, or one head of a token). Rows are addressed through
(token, head) strides so strided views of fused projection outputs need no copy. The row length
need not be a power of two or a multiple of 128: BLOCK is the next power of two and lanes are
masked.
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def rmsnorm_rows_kernel(
    x_ptr, w_ptr, out_ptr,
    heads, stride_xt, stride_xh, stride_ot, stride_oh,
    N, eps,
    MODE: tl.constexpr,  # 0: rms * (1 + w), 1: rms * w
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    t = row // heads
    h = row % heads
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + offs, mask=mask, other=0.0).to(tl.float32)
    ss = tl.sum(x * x, axis=0)
    rstd = tl.rsqrt(ss / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if MODE == 0:
        w = w + 1.0
    y = x * rstd * w
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gated_rmsnorm_kernel(
    x_ptr, z_ptr, w_ptr, out_ptr,
    heads, stride_xt, stride_xh, stride_zt, stride_zh, stride_ot,
    N, eps,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    t = row // heads
    h = row % heads
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * stride_zt + h * stride_zh + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    silu = z / (1.0 + tl.exp(-z))
    y = x * rstd * w * silu
    tl.store(out_ptr + t * stride_ot + h * N + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
