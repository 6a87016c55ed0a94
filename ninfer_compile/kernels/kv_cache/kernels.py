"""Triton kernel of the KV-cache append: quantize-on-append in any KV format (formats.py; the
codecs' encoders in codecs.py, their oracles in reference.py).

Grid (T, Hkv): one program writes one token's K and V rows of one KV head. A row is rotated first
when its codec rotates (the normalised WHT over the row or over 64-value blocks), then viewed as
[BD / GROUP groups, GROUP lanes] so each group's amax / RMS is a row reduction. bf16 and int8-g64
keep the original path (the same stores as before the formats were data).
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter
from .codecs import e2m1_encode, e4m3_decode, e4m3_encode, lloyd4_decode, lloyd4_index, round_away, wht


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
def _append_codec(src_ptr, src_off, dst_ptr, scale_ptr, row, D, NSC, rot_norm,
                  KIND: tl.constexpr, GROUP: tl.constexpr, ROT: tl.constexpr, BD: tl.constexpr):
    """One row of D values -> codes + scales of a codec (kind 1..5; optionally rotated first)."""
    NG: tl.constexpr = BD // GROUP
    od = tl.arange(0, BD)
    x = tl.load(src_ptr + src_off + od, mask=od < D, other=0.0).to(tl.float32)  # [BD]
    if ROT > 0:
        x = tl.reshape(wht(tl.reshape(x, [1, BD]), 1, BD, ROT), [BD]) * rot_norm
    g = tl.reshape(x, [NG, GROUP])
    gi = tl.arange(0, NG)
    offs = gi[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [NG, GROUP] dimension index
    gmask = gi * GROUP < D
    amax = tl.max(tl.abs(g), axis=1)  # [NG]
    if KIND == 1:
        s16 = (amax / 127.0).to(tl.float16)
        s = s16.to(tl.float32)
        code = tl.minimum(tl.maximum(round_away(g / tl.where(s > 0, s, 1.0)[:, None]), -127.0), 127.0)
        code = tl.where((s > 0)[:, None], code, 0.0)
        tl.store(dst_ptr + row * D + offs, code.to(tl.int8), mask=offs < D)
        tl.store(scale_ptr + row * NSC + gi, s16, mask=gmask)
    elif KIND == 2:
        s16 = (amax / 448.0).to(tl.float16)
        s = s16.to(tl.float32)
        code = e4m3_encode(g / tl.where(s > 0, s, 1.0)[:, None])
        code = tl.where((s > 0)[:, None], code, 0)
        tl.store(dst_ptr + row * D + offs, code.to(tl.uint8), mask=offs < D)
        tl.store(scale_ptr + row * NSC + gi, s16, mask=gmask)
    else:
        if KIND == 3:
            sb = e4m3_encode(amax / 6.0)  # [NG] e4m3 scale bytes
            s = e4m3_decode(sb)
            nib = e2m1_encode(g / tl.where(s > 0, s, 1.0)[:, None])
            nib = tl.where((s > 0)[:, None], nib, 0)
            tl.store(scale_ptr + row * NSC + gi, sb.to(tl.uint8), mask=gmask)
        elif KIND == 4:
            s16 = (amax / 7.0).to(tl.float16)
            s = s16.to(tl.float32)
            code = tl.minimum(tl.maximum(round_away(g / tl.where(s > 0, s, 1.0)[:, None]), -7.0), 7.0)
            code = tl.where((s > 0)[:, None], code, 0.0)
            nib = code.to(tl.int32) & 15
            tl.store(scale_ptr + row * NSC + gi, s16, mask=gmask)
        else:
            rms = tl.sqrt(tl.sum(g * g, axis=1) / GROUP)  # [NG]
            inv = tl.where(rms > 0, 1.0 / tl.where(rms > 0, rms, 1.0), 0.0)
            nib = lloyd4_index(tl.abs(g) * inv[:, None]) | tl.where(g < 0, 8, 0)
            c = lloyd4_decode(nib)
            cc = tl.sum(c * c, axis=1)
            sc = tl.where(rms > 0, tl.sum(g * c, axis=1) / cc, 0.0)
            tl.store(scale_ptr + row * NSC + gi, sc.to(tl.float16), mask=gmask)
        lo, hi = tl.split(tl.reshape(nib, [BD // 2, 2]))
        j = tl.arange(0, BD // 2)
        tl.store(dst_ptr + row * (D // 2) + j, (lo | (hi << 4)).to(tl.uint8), mask=j < D // 2)


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


@triton.jit
def kv_append_codec_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pos_ptr, slots_ptr,
    Hkv, D, max_ctx, NSCK, NSCV, k_rot_norm,
    stride_kt, stride_kh, stride_vt, stride_vh,
    KKIND: tl.constexpr, KGROUP: tl.constexpr, KROT: tl.constexpr,
    VKIND: tl.constexpr, VGROUP: tl.constexpr, BD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The quantized formats other than int8 (formats.py): K and V each in its own codec."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(slots_ptr + t).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    row = (s * max_ctx + p) * Hkv + h
    _append_codec(k_ptr, t * stride_kt + h * stride_kh, kc_ptr, ks_ptr, row, D, NSCK, k_rot_norm,
                  KIND=KKIND, GROUP=KGROUP, ROT=KROT, BD=BD)
    _append_codec(v_ptr, t * stride_vt + h * stride_vh, vc_ptr, vs_ptr, row, D, NSCV, 1.0,
                  KIND=VKIND, GROUP=VGROUP, ROT=0, BD=BD)
