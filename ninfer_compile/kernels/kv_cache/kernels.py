"""Triton kernel of the KV-cache append (bf16 copy, or int8-g64 quantisation; codec in reference.py).

Grid (T, Hkv): one program writes one token's K and V rows of one KV head, viewed as
[D/64 groups, 64 lanes] so the per-group amax is a row reduction.
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def _append_one(src_ptr, src_off, dst_ptr, scale_ptr, dst_off, scale_off, D,
                QUANT: tl.constexpr, NG: tl.constexpr, GL: tl.constexpr):
    gi = tl.arange(0, NG)
    li = tl.arange(0, GL)
    offs = gi[:, None] * GL + li[None, :]
    m = offs < D
    x = tl.load(src_ptr + src_off + offs, mask=m, other=0.0).to(tl.float32)
    if QUANT:
        amax = tl.max(tl.abs(x), axis=1)  # [NG]
        s16 = (amax / 127.0).to(tl.float16)
        s = s16.to(tl.float32)
        y = x / tl.where(s > 0, s, 1.0)[:, None]
        code = tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(-y + 0.5))
        code = tl.minimum(tl.maximum(code, -127.0), 127.0)
        code = tl.where((s > 0)[:, None], code, 0.0)
        tl.store(dst_ptr + dst_off + offs, code.to(tl.int8), mask=m)
        tl.store(scale_ptr + scale_off + gi, s16, mask=gi * GL < D)
    else:
        tl.store(dst_ptr + dst_off + offs, x.to(dst_ptr.dtype.element_ty), mask=m)


@triton.jit
def kv_append_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pos_ptr, slots_ptr,
    Hkv, D, max_ctx,
    stride_kt, stride_kh, stride_vt, stride_vh,
    QUANT: tl.constexpr, NG: tl.constexpr, GL: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(slots_ptr + t).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    row = (s * max_ctx + p) * Hkv + h
    ngroups = D // 64
    _append_one(k_ptr, t * stride_kt + h * stride_kh, kc_ptr, ks_ptr, row * D, row * ngroups, D,
                QUANT=QUANT, NG=NG, GL=GL)
    _append_one(v_ptr, t * stride_vt + h * stride_vh, vc_ptr, vs_ptr, row * D, row * ngroups, D,
                QUANT=QUANT, NG=NG, GL=GL)
