"""Triton kernels of partial NeoX RoPE.

One program handles one (token, head) row. The rotation partner of lane d (d +/- rotary_dim/2) is
loaded a second time from memory instead of permuting registers, so the whole row is read before
anything is written: `out` may alias `x` (in-place).
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def _rotate_row(x_ptr, xrow, prow, w_ptr, pos, offs, D, log2_theta, eps,
                ROT: tl.constexpr, NORM: tl.constexpr):
    HALF: tl.constexpr = ROT // 2
    mask = offs < D
    partner = tl.where(offs < HALF, offs + HALF, tl.where(offs < ROT, offs - HALF, offs))
    x = tl.load(x_ptr + xrow + offs, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + xrow + partner, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + 1.0
        wp = tl.load(w_ptr + partner, mask=mask, other=0.0).to(tl.float32) + 1.0
        x = x * rstd * w
        xp = xp * rstd * wp
    i = tl.where(offs < HALF, offs, offs - HALF).to(tl.float32)
    inv_freq = tl.exp2(-(2.0 * i / ROT) * log2_theta)
    ang = pos * inv_freq
    c = tl.cos(ang)
    s = tl.sin(ang)
    y = tl.where(offs < HALF, x * c - xp * s, tl.where(offs < ROT, x * c + xp * s, x))
    return y, mask


@triton.jit
def rope_kernel(
    x_ptr, out_ptr, pos_ptr,
    heads, stride_xt, stride_xh, stride_ot, stride_oh,
    D, log2_theta,
    ROT: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    t = row // heads
    h = row % heads
    offs = tl.arange(0, BLOCK)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    y, mask = _rotate_row(x_ptr, t * stride_xt + h * stride_xh, 0, x_ptr, pos, offs, D, log2_theta, 0.0,
                          ROT=ROT, NORM=False)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def qk_norm_rope_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, qo_ptr, ko_ptr, pos_ptr,
    hq, hk,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    D, log2_theta, eps,
    ROT: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (T * (hq + hk),): rows [0, hq) of a token are q heads, [hq, hq + hk) are k heads."""
    pdl_enter(PDL)
    row = tl.program_id(0)
    per = hq + hk
    t = row // per
    h = row % per
    offs = tl.arange(0, BLOCK)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    if h < hq:
        y, mask = _rotate_row(q_ptr, t * stride_qt + h * stride_qh, 0, qw_ptr, pos, offs, D, log2_theta, eps,
                              ROT=ROT, NORM=True)
        tl.store(qo_ptr + t * stride_qot + h * stride_qoh + offs, y.to(qo_ptr.dtype.element_ty), mask=mask)
    else:
        hh = h - hq
        y, mask = _rotate_row(k_ptr, t * stride_kt + hh * stride_kh, 0, kw_ptr, pos, offs, D, log2_theta, eps,
                              ROT=ROT, NORM=True)
        tl.store(ko_ptr + t * stride_kot + hh * stride_koh + offs, y.to(ko_ptr.dtype.element_ty), mask=mask)
