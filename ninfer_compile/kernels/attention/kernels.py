"""Triton kernels of gated GQA attention over a (bf16 or int8-g64) KV cache.

attn_decode_kernel   grid (T, Hkv, NSPLIT): one program = one column, one KV head with its
                     G query heads packed as the M rows of the dots (GP >= 16 rows), one split of
                     the column's ctx cache rows (flash-decoding): fixed splits of SPLIT rows, or
                     with BALANCED splits spread per column, span = cdiv(cdiv(ctx, NSPLIT), BN) * BN
                     rows each (`_split_span`), so every program has work at any depth (fixed splits
                     leave 32 of 160 programs busy at 4K of a 20K cache on the 27B; the route's
                     default since 2026-12-01, `balance: fixed` keeps fixed splits). With NSPLIT == 1 it normalises, gates and
                     stores directly; otherwise it writes (acc, m, l) partials to the workspace
                     and attn_decode_reduce_kernel (grid (T, Hq)) merges the splits.
attn_verify_kernel   grid (rows, Hkv, NSPLIT): a verify row's W columns x G query heads as the dot rows
                     of one program (each cache row read once per row, causal within it); the same
                     workspace and reduce as attn_decode_kernel.
attn_prefill_kernel  grid (cdiv(T, BM), Hq): flash attention of BM consecutive columns of one
                     sequence against its cache rows 0..position (causal per row).
Softmax runs in base 2 (q pre-scaled by scale * log2 e); output x sigmoid(gate) in the epilogue.

KV formats (kv_cache/formats.py): KKIND / VKIND pick each cache's codec (0 bf16, 1 int8-g64: the
original loads; 2..5: kv_cache/codecs.py `load_rows`, dequantized on load with one scale per
KGROUP / VGROUP lanes); where K is stored rotated (ROT > 0: the normalised WHT over ROT-lane
blocks) Q is rotated alike in registers before the scores (Q R . (K R)^T = Q . K^T).
"""

import triton
import triton.language as tl
from ..kv_cache.codecs import load_rows, wht
from ..pdl import pdl_enter

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    """bf16 tensor-core dot; F32 (the CPU interpreter, whose bf16 dot is wrong in Triton 3.9)
    upcasts both operands to float32 first."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _load_kv(c_ptr, sc_ptr, s, n, nmask, h, Hkv, D, max_ctx, od,
             QUANT: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """Cache rows n ([BN]) of KV head h -> [BN, BD] bf16."""
    row = (s * max_ctx + n.to(tl.int64)) * Hkv + h
    m = nmask[:, None] & (od < D)[None, :]
    x = tl.load(c_ptr + row[:, None] * D + od[None, :], mask=m, other=0.0)
    if QUANT:
        # one fp16 scale per 64 lanes: load [BN, BD/64] scales and broadcast over a [BN, BD/64, 64] view
        NG: tl.constexpr = BD // 64
        gi = tl.arange(0, NG)
        sc = tl.load(sc_ptr + row[:, None] * (D // 64) + gi[None, :],
                     mask=nmask[:, None] & (gi * 64 < D)[None, :], other=0.0).to(tl.float32)
        x3 = tl.reshape(x.to(tl.float32), [BN, NG, 64])
        x = tl.reshape(x3 * sc[:, :, None], [BN, BD]).to(tl.bfloat16)
    return x


@triton.jit
def _load_any(c_ptr, sc_ptr, s, n, nmask, h, Hkv, D, max_ctx, od, NSC,
              KIND: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """Cache rows n ([BN]) of KV head h in codec KIND -> [BN, BD] bf16."""
    if KIND <= 1:
        x = _load_kv(c_ptr, sc_ptr, s, n, nmask, h, Hkv, D, max_ctx, od, KIND == 1, BN, BD)
    else:
        row = (s * max_ctx + n.to(tl.int64)) * Hkv + h
        x = load_rows(c_ptr, sc_ptr, row, nmask, od, D, NSC, KIND, GROUP, BN, BD).to(tl.bfloat16)
    return x


@triton.jit
def _scaled_q(q, qk_scale, rot_norm, R: tl.constexpr, BD: tl.constexpr, ROT: tl.constexpr):
    """q [R, BD] -> bf16 q x qk_scale, rotated by the normalised WHT-ROT first when ROT > 0."""
    if ROT > 0:
        q = (wht(q.to(tl.float32), R, BD, ROT) * (qk_scale * rot_norm)).to(tl.bfloat16)
    else:
        q = (q.to(tl.float32) * qk_scale).to(tl.bfloat16)
    return q


@triton.jit
def _split_span(ctx, NSPLIT, SPLIT, BN: tl.constexpr, BALANCED: tl.constexpr):
    """Cache rows per split for a column `ctx` deep: SPLIT, or (BALANCED) ctx spread over the
    NSPLIT splits, BN-aligned (<= SPLIT, as NSPLIT = cdiv(max_ctx, SPLIT))."""
    if BALANCED:
        return tl.cdiv(tl.cdiv(ctx, NSPLIT), BN) * BN
    else:
        return SPLIT


@triton.jit
def attn_decode_kernel(
    q_ptr, gate_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pos_ptr, slots_ptr, out_ptr, ws_ptr,
    Hq, Hkv, G, D, max_ctx, qk_scale,
    stride_qt, stride_qh, stride_gt, stride_gh, stride_ot,
    NSPLIT, SPLIT, NSCK, NSCV, rot_norm,
    GP: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, DIRECT: tl.constexpr,
    F32: tl.constexpr, KKIND: tl.constexpr, KGROUP: tl.constexpr, VKIND: tl.constexpr, VGROUP: tl.constexpr,
    ROT: tl.constexpr, BALANCED: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    s = tl.load(slots_ptr + t).to(tl.int64)
    ctx = tl.load(pos_ptr + t) + 1
    span = _split_span(ctx, NSPLIT, SPLIT, BN, BALANCED)
    start = sp * span
    end = tl.minimum(start + span, ctx)
    gi = tl.arange(0, GP)
    od = tl.arange(0, BD)
    gmask = gi < G
    qh = kvh * G + gi
    dmask = od < D
    q = tl.load(q_ptr + t * stride_qt + qh[:, None] * stride_qh + od[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    q = _scaled_q(q, qk_scale, rot_norm, GP, BD, ROT)
    m_i = tl.full([GP], -float("inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, BD], tl.float32)
    for n0 in range(start, end, BN):
        n = n0 + tl.arange(0, BN)
        nmask = n < end
        k = _load_any(kc_ptr, ks_ptr, s, n, nmask, kvh, Hkv, D, max_ctx, od, NSCK, KKIND, KGROUP, BN, BD)
        v = _load_any(vc_ptr, vs_ptr, s, n, nmask, kvh, Hkv, D, max_ctx, od, NSCV, VKIND, VGROUP, BN, BD)
        sc = _dot(q, tl.trans(k), F32)  # [GP, BN]
        sc = tl.where(nmask[None, :], sc, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(tl.bfloat16), v, F32)
        m_i = m_new
    if DIRECT:
        gt = tl.load(gate_ptr + t * stride_gt + qh[:, None] * stride_gh + od[None, :],
                     mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        o = acc / l_i[:, None] / (1.0 + tl.exp(-gt))
        tl.store(out_ptr + t * stride_ot + qh[:, None] * D + od[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=gmask[:, None] & dmask[None, :])
    else:
        if start < ctx:
            base = ((t * Hq + qh) * NSPLIT + sp) * (D + 2)  # [GP]
            tl.store(ws_ptr + base[:, None] + od[None, :], acc, mask=gmask[:, None] & dmask[None, :])
            tl.store(ws_ptr + base + D, m_i, mask=gmask)
            tl.store(ws_ptr + base + D + 1, l_i, mask=gmask)


@triton.jit
def attn_decode_reduce_kernel(
    gate_ptr, pos_ptr, out_ptr, ws_ptr,
    Hq, D, stride_gt, stride_gh, stride_ot, NSPLIT, SPLIT,
    BD: tl.constexpr, BS: tl.constexpr, BN: tl.constexpr, BALANCED: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    ctx = tl.load(pos_ptr + t) + 1
    nvalid = tl.cdiv(ctx, _split_span(ctx, NSPLIT, SPLIT, BN, BALANCED))  # the splits attn_decode_kernel filled
    od = tl.arange(0, BD)
    dmask = od < D
    base = (t * Hq + h) * NSPLIT * (D + 2)
    m_run = tl.max(tl.full([BS], -float("inf"), tl.float32), axis=0)
    l_run = tl.sum(tl.zeros([BS], tl.float32), axis=0)
    acc = tl.zeros([BD], tl.float32)
    for s0 in range(0, nvalid, BS):
        si = s0 + tl.arange(0, BS)
        smask = si < nvalid
        m = tl.load(ws_ptr + base + si * (D + 2) + D, mask=smask, other=-float("inf"))
        l = tl.load(ws_ptr + base + si * (D + 2) + D + 1, mask=smask, other=0.0)
        a = tl.load(ws_ptr + base + si[:, None] * (D + 2) + od[None, :], mask=smask[:, None] & dmask[None, :],
                    other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, axis=0))
        w = tl.where(smask, tl.exp2(m - m_new), 0.0)
        alpha = tl.exp2(m_run - m_new)
        l_run = l_run * alpha + tl.sum(l * w, axis=0)
        acc = acc * alpha + tl.sum(a * w[:, None], axis=0)
        m_run = m_new
    gt = tl.load(gate_ptr + t * stride_gt + h * stride_gh + od, mask=dmask, other=0.0).to(tl.float32)
    o = acc / l_run / (1.0 + tl.exp(-gt))
    tl.store(out_ptr + t * stride_ot + h * D + od, o.to(out_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _causal_rows(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, s, start, end, last, kvh, Hkv, D, max_ctx, od, NSCK, NSCV,
                 R: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, F32: tl.constexpr,
                 KKIND: tl.constexpr, KGROUP: tl.constexpr, VKIND: tl.constexpr, VGROUP: tl.constexpr):
    """Online softmax of the R query rows q (scaled, bf16 [R, BD]) over cache rows start .. end-1 of
    slot s / KV head kvh, row r seeing rows <= last[r] (a row with none yet stays at m = -inf, l = 0).
    Returns (m [R], l [R], acc [R, BD]) in base 2."""
    m_i = tl.full([R], -float("inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BD], tl.float32)
    for n0 in range(start, end, BN):
        n = n0 + tl.arange(0, BN)
        nmask = n < end
        k = _load_any(kc_ptr, ks_ptr, s, n, nmask, kvh, Hkv, D, max_ctx, od, NSCK, KKIND, KGROUP, BN, BD)
        v = _load_any(vc_ptr, vs_ptr, s, n, nmask, kvh, Hkv, D, max_ctx, od, NSCV, VKIND, VGROUP, BN, BD)
        sc = _dot(q, tl.trans(k), F32)  # [R, BN]
        ok = (n[None, :] <= last[:, None]) & nmask[None, :]
        sc = tl.where(ok, sc, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(tl.bfloat16), v, F32)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def attn_prefill_kernel(
    q_ptr, gate_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pos_ptr, slots_ptr, out_ptr,
    T, Hkv, G, D, max_ctx, qk_scale,
    stride_qt, stride_qh, stride_gt, stride_gh, stride_ot, NSCK, NSCV, rot_norm,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, F32: tl.constexpr,
    KKIND: tl.constexpr, KGROUP: tl.constexpr, VKIND: tl.constexpr, VGROUP: tl.constexpr, ROT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    mb = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // G
    rows = mb * BM + tl.arange(0, BM)
    rmask = rows < T
    s = tl.load(slots_ptr + mb * BM).to(tl.int64)
    pos = tl.load(pos_ptr + rows, mask=rmask, other=-1)
    end = tl.max(pos, axis=0) + 1
    od = tl.arange(0, BD)
    dmask = od < D
    qm = rmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + od[None, :], mask=qm, other=0.0)
    q = _scaled_q(q, qk_scale, rot_norm, BM, BD, ROT)
    m_i, l_i, acc = _causal_rows(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, s, 0, end, pos, kvh, Hkv, D, max_ctx, od,
                                 NSCK, NSCV, BM, BD, BN, F32, KKIND, KGROUP, VKIND, VGROUP)
    gt = tl.load(gate_ptr + rows[:, None] * stride_gt + h * stride_gh + od[None, :], mask=qm, other=0.0)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None] / (1.0 + tl.exp(-gt.to(tl.float32)))
    tl.store(out_ptr + rows[:, None] * stride_ot + h * D + od[None, :], o.to(out_ptr.dtype.element_ty), mask=qm)


@triton.jit
def attn_verify_kernel(
    q_ptr, gate_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pos_ptr, slots_ptr, out_ptr, ws_ptr,
    Hq, Hkv, G, D, max_ctx, qk_scale,
    stride_qt, stride_qh, stride_gt, stride_gh, stride_ot,
    NSPLIT, SPLIT, NSCK, NSCV, rot_norm,
    W: tl.constexpr, MP: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, DIRECT: tl.constexpr,
    F32: tl.constexpr, KKIND: tl.constexpr, KGROUP: tl.constexpr, VKIND: tl.constexpr, VGROUP: tl.constexpr,
    ROT: tl.constexpr, BALANCED: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    """Grid (rows, Hkv, NSPLIT): one verify row (W columns of one slot, consecutive positions) x one
    KV head: its W x G query heads packed as the MP rows of the dots, so each cache row is read once
    for the whole row instead of once per column. Packed row m = column m // G, query head
    kvh * G + m % G; it sees cache rows 0..positions[t] (causal within the row). The split span
    follows the row's deepest column; a column whose own span would be smaller still gets
    every split attn_decode_reduce_kernel reads for it (empty ones as m = -inf, l = 0), and every
    cache row it sees lands in exactly one of them, so the reduce merges as for attn_decode_kernel."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    t0 = r * W
    s = tl.load(slots_ptr + t0).to(tl.int64)
    mi = tl.arange(0, MP)
    j = mi // G
    mmask = j < W
    t = t0 + tl.minimum(j, W - 1)  # [MP] column of packed row m
    qh = kvh * G + mi % G
    ctx = tl.load(pos_ptr + t) + 1  # [MP]
    ctx_row = tl.max(ctx, axis=0)  # the row's deepest column (its last)
    span = _split_span(ctx_row, NSPLIT, SPLIT, BN, BALANCED)
    start = sp * span
    end = tl.minimum(start + span, ctx_row)
    od = tl.arange(0, BD)
    dmask = od < D
    qm = mmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + t[:, None] * stride_qt + qh[:, None] * stride_qh + od[None, :], mask=qm, other=0.0)
    q = _scaled_q(q, qk_scale, rot_norm, MP, BD, ROT)
    m_i, l_i, acc = _causal_rows(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, s, start, end, ctx - 1, kvh, Hkv, D, max_ctx,
                                 od, NSCK, NSCV, MP, BD, BN, F32, KKIND, KGROUP, VKIND, VGROUP)
    if DIRECT:
        gt = tl.load(gate_ptr + t[:, None] * stride_gt + qh[:, None] * stride_gh + od[None, :],
                     mask=qm, other=0.0).to(tl.float32)
        o = acc / l_i[:, None] / (1.0 + tl.exp(-gt))
        tl.store(out_ptr + t[:, None] * stride_ot + qh[:, None] * D + od[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=qm)
    else:
        # the splits the reduce reads for column t (its own span): empty ones included
        nvalid = tl.cdiv(ctx, _split_span(ctx, NSPLIT, SPLIT, BN, BALANCED))  # [MP]
        wm = mmask & (sp < nvalid)
        base = ((t * Hq + qh) * NSPLIT + sp) * (D + 2)  # [MP]
        tl.store(ws_ptr + base[:, None] + od[None, :], acc, mask=wm[:, None] & dmask[None, :])
        tl.store(ws_ptr + base + D, m_i, mask=wm)
        tl.store(ws_ptr + base + D + 1, l_i, mask=wm)
