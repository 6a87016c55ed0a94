"""Triton kernels of the Gated DeltaNet core.

gdn_gating_kernel       elementwise g / beta.
gdn_gating_proj_kernel  a = x Wa^T, b = x Wb^T and g / beta in one launch; grid
                        (cdiv(Hv, BLOCK_H), cdiv(T, BLOCK_T)); each program reduces all of K for
                        its [BLOCK_T, BLOCK_H] tile in fp32 registers ([BT, BH, BLOCK_K] partial
                        sums spread over the warps, one cross-warp tl.sum at the end), so no
                        split-K partials and no second launch.
gdn_decode_kernel       recurrent step; grid (T, Hv, cdiv(Dv, BV)); each column its own slot.
                        q/k L2 norm fused; the [Dk, BV] state block lives in registers.
gdn_verify_kernel       verify rows (speculative decoding): grid (C, Hv, cdiv(Dv, BV)); row r =
                        columns r*W .. r*W+W-1 of one slot (W constexpr); their q, k, v, g, beta
                        are loaded at once, then the program walks them in order with
                        the [Dk, BV] state block in registers (read once), writing out per column,
                        the state after each of the first W-1 columns to state_columns[r, j] and
                        the final state in place.
gdn_chunk_prep_kernel   chunked prefill phase 1, grid (n_chunks, Hv), all chunks in parallel:
                        A[i,j] = beta_i exp(gc_i - gc_j) k_i.k_j (j < i, gc = in-chunk cumsum
                        of g), Tinv = (I + A)^-1 by forward substitution, then
                        W = Tinv (beta exp(gc) K) [BT, Dk] and U = Tinv (beta V) [BT, Dv]
                        (the UT transform); W, U, gc go to the caller's workspace.
gdn_chunk_state_kernel  phase 2, grid (Hv, cdiv(Dv, BV)), sequential over chunks with the
                        state block in registers:
                          U' = U - W S0
                          o  = exp(gc) (scale q) S0 + [causal (scale q) K^T * exp(gc_i - gc_j)] U'
                          S  = exp(gc_last) S0 + (K * exp(gc_last - gc))^T U'
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def gdn_gating_kernel(a_ptr, b_ptr, alog_ptr, dtb_ptr, g_ptr, beta_ptr, n, Hv, stride_at, stride_bt,
                      BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    t = offs // Hv
    h = offs % Hv
    a = tl.load(a_ptr + t * stride_at + h, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + t * stride_bt + h, mask=m, other=0.0).to(tl.float32)
    alog = tl.load(alog_ptr + h, mask=m, other=0.0).to(tl.float32)
    dtb = tl.load(dtb_ptr + h, mask=m, other=0.0).to(tl.float32)
    x = a + dtb
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    g = -tl.exp(alog) * sp
    beta = 1.0 / (1.0 + tl.exp(-b))
    tl.store(g_ptr + offs, g, mask=m)
    tl.store(beta_ptr + offs, beta, mask=m)


@triton.jit
def gdn_gating_proj_kernel(x_ptr, wa_ptr, wb_ptr, alog_ptr, dtb_ptr, g_ptr, beta_ptr, T, Hv, K,
                           stride_xt, stride_wa, stride_wb,
                           BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                           PDL: tl.constexpr = False):
    pdl_enter(PDL)
    offs_h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    hm = offs_h < Hv
    tm = offs_t < T
    ok0 = tl.arange(0, BLOCK_K)
    acc_a = tl.zeros([BLOCK_T, BLOCK_H, BLOCK_K], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_T, BLOCK_H, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ok = k0 + ok0
        km = ok < K
        x = tl.load(x_ptr + offs_t[:, None] * stride_xt + ok[None, :], mask=tm[:, None] & km[None, :],
                    other=0.0).to(tl.float32)
        wm = hm[:, None] & km[None, :]
        wa = tl.load(wa_ptr + offs_h[:, None] * stride_wa + ok[None, :], mask=wm, other=0.0).to(tl.float32)
        wb = tl.load(wb_ptr + offs_h[:, None] * stride_wb + ok[None, :], mask=wm, other=0.0).to(tl.float32)
        acc_a += x[:, None, :] * wa[None, :, :]
        acc_b += x[:, None, :] * wb[None, :, :]
    a = tl.sum(acc_a, axis=2)  # [BLOCK_T, BLOCK_H]
    b = tl.sum(acc_b, axis=2)
    alog = tl.load(alog_ptr + offs_h, mask=hm, other=0.0).to(tl.float32)
    dtb = tl.load(dtb_ptr + offs_h, mask=hm, other=0.0).to(tl.float32)
    z = a + dtb[None, :]
    sp = tl.where(z > 20.0, z, tl.log(1.0 + tl.exp(tl.minimum(z, 20.0))))
    g = -tl.exp(alog)[None, :] * sp
    beta = 1.0 / (1.0 + tl.exp(-b))
    o = offs_t[:, None] * Hv + offs_h[None, :]
    om = tm[:, None] & hm[None, :]
    tl.store(g_ptr + o, g, mask=om)
    tl.store(beta_ptr + o, beta, mask=om)


@triton.jit
def _l2norm(x, eps):
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + eps)


@triton.jit
def _load_qk_row(ptr, base, offs, D, eps):
    return _l2norm(tl.load(ptr + base + offs, mask=offs < D, other=0.0).to(tl.float32), eps)


@triton.jit
def gdn_decode_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, o_ptr, pos_ptr, slots_ptr,
    Hv, REP, Dk, Dv, scale, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ss, stride_sh, stride_ot, stride_oh,
    BK: tl.constexpr, BV: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    hk = h // REP
    s = tl.load(slots_ptr + t).to(tl.int64)
    p = tl.load(pos_ptr + t)
    ok = tl.arange(0, BK)
    ov = vb * BV + tl.arange(0, BV)
    kmask = ok < Dk
    vmask = ov < Dv
    q = _load_qk_row(q_ptr, t * stride_qt + hk * stride_qh, ok, Dk, eps) * scale
    k = _load_qk_row(k_ptr, t * stride_kt + hk * stride_kh, ok, Dk, eps)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + ov, mask=vmask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + t * Hv + h)
    beta = tl.load(beta_ptr + t * Hv + h)
    sptrs = state_ptr + s * stride_ss + h * stride_sh + ok[:, None] * Dv + ov[None, :]
    smask = kmask[:, None] & vmask[None, :]
    S = tl.load(sptrs, mask=smask, other=0.0)  # [BK, BV]
    S = tl.where(p > 0, S, 0.0)  # position 0 starts from a zero state
    S = S * tl.exp(g)
    u = beta * (v - tl.sum(S * k[:, None], axis=0))  # [BV]
    S = S + k[:, None] * u[None, :]
    o = tl.sum(S * q[:, None], axis=0)
    tl.store(sptrs, S, mask=smask)
    tl.store(o_ptr + t * stride_ot + h * stride_oh + ov, o.to(o_ptr.dtype.element_ty), mask=vmask)


@triton.jit
def _row(X, idx, j):
    """Row j of a register tile X [R, N] -> [N] (exact: one term, the rest zeros)."""
    return tl.sum(tl.where((idx == j)[:, None], X, 0.0), axis=0)


@triton.jit
def gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, o_ptr, pos_ptr, slots_ptr, cols_ptr,
    Hv, REP, Dk, Dv, scale, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ss, stride_sh, stride_ot, stride_oh, stride_cr, stride_cj, stride_ch,
    W: tl.constexpr, WP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The row's W columns of q, k, v, g, beta are loaded at once ([WP, BK] / [WP, BV] / [WP] tiles,
    before any store: the loads of later columns do not wait on the stores of earlier ones), then the
    W steps run on the state block in registers, each as gdn_decode_kernel computes it."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    hk = h // REP
    t0 = r * W
    s = tl.load(slots_ptr + t0).to(tl.int64)
    p = tl.load(pos_ptr + t0)
    ok = tl.arange(0, BK)
    ov = vb * BV + tl.arange(0, BV)
    kmask = ok < Dk
    vmask = ov < Dv
    wi = tl.arange(0, WP)
    wmask = wi < W
    tw = t0 + wi  # [WP] the row's columns
    Q = tl.load(q_ptr + tw[:, None] * stride_qt + hk * stride_qh + ok[None, :],
                mask=wmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)  # [WP, BK]
    Kt = tl.load(k_ptr + tw[:, None] * stride_kt + hk * stride_kh + ok[None, :],
                 mask=wmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)  # [WP, BK]
    V = tl.load(v_ptr + tw[:, None] * stride_vt + h * stride_vh + ov[None, :],
                mask=wmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)  # [WP, BV]
    G = tl.load(g_ptr + tw * Hv + h, mask=wmask, other=0.0)  # [WP]
    B = tl.load(beta_ptr + tw * Hv + h, mask=wmask, other=0.0)
    blk = ok[:, None] * Dv + ov[None, :]  # [BK, BV] offsets in a [Dk, Dv] block
    smask = kmask[:, None] & vmask[None, :]
    sptrs = state_ptr + s * stride_ss + h * stride_sh + blk
    S = tl.load(sptrs, mask=smask, other=0.0)  # [BK, BV] f32, read once
    S = tl.where(p > 0, S, 0.0)  # a row starting at position 0 starts from a zero state
    cbase = cols_ptr + r.to(tl.int64) * stride_cr + h * stride_ch + blk
    for j in tl.static_range(W):
        t = t0 + j
        q = _l2norm(_row(Q, wi, j), eps) * scale
        k = _l2norm(_row(Kt, wi, j), eps)
        v = _row(V, wi, j)
        g = tl.sum(tl.where(wi == j, G, 0.0), axis=0)
        beta = tl.sum(tl.where(wi == j, B, 0.0), axis=0)
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))  # [BV]
        S = S + k[:, None] * u[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + t * stride_ot + h * stride_oh + ov, o.to(o_ptr.dtype.element_ty), mask=vmask)
        if j < W - 1:  # the state after column j, for the rollback (kernels/spec_state)
            tl.store(cbase + j * stride_cj, S, mask=smask)
    tl.store(sptrs, S, mask=smask)


@triton.jit
def _chunk_qkg(k_ptr, g_ptr, beta_ptr, rows, rmask, hk, h, Hv, ok, Dk, stride_kt, stride_kh, eps):
    kmask = rmask[:, None] & (ok < Dk)[None, :]
    k = tl.load(k_ptr + rows[:, None] * stride_kt + hk * stride_kh + ok[None, :], mask=kmask, other=0.0)
    k = k.to(tl.float32)
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + eps)[:, None]
    g = tl.load(g_ptr + rows * Hv + h, mask=rmask, other=0.0)
    beta = tl.load(beta_ptr + rows * Hv + h, mask=rmask, other=0.0)
    gc = tl.cumsum(g, axis=0)
    return k, gc, beta


@triton.jit
def gdn_chunk_prep_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, gc_ptr,
    T, Hv, REP, Dk, Dv, eps,
    stride_kt, stride_kh, stride_vt, stride_vh,
    BT: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    c = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // REP
    rows = c * BT + tl.arange(0, BT)
    rmask = rows < T
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BVF)
    k, gc, beta = _chunk_qkg(k_ptr, g_ptr, beta_ptr, rows, rmask, hk, h, Hv, ok, Dk, stride_kt, stride_kh, eps)
    v = tl.load(v_ptr + rows[:, None] * stride_vt + h * stride_vh + ov[None, :],
                mask=rmask[:, None] & (ov < Dv)[None, :], other=0.0).to(tl.float32)
    ri = tl.arange(0, BT)
    lower = ri[:, None] > ri[None, :]
    kk = tl.dot(k, tl.trans(k), input_precision=PRECISION)  # [BT, BT]
    A = tl.where(lower, beta[:, None] * kk * tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0)), 0.0)
    # Tinv = (I + A)^-1, row i = e_i - sum_{j<i} A[i, j] Tinv[j]
    eye = (ri[:, None] == ri[None, :]).to(tl.float32)
    Tinv = eye
    for i in range(1, BT):
        sel = ri[:, None] == i
        a_i = tl.sum(tl.where(sel, A, 0.0), axis=0)  # [BT] (entries j < i)
        row = tl.sum(a_i[:, None] * Tinv, axis=0)  # [BT]
        Tinv = tl.where(sel, Tinv - row[None, :], Tinv)
    kb = k * (beta * tl.exp(gc))[:, None]
    vb = v * beta[:, None]
    w = tl.dot(Tinv, kb, input_precision=PRECISION)  # [BT, BK]
    u = tl.dot(Tinv, vb, input_precision=PRECISION)  # [BT, BVF]
    tl.store(w_ptr + (rows[:, None] * Hv + h) * Dk + ok[None, :], w, mask=rmask[:, None] & (ok < Dk)[None, :])
    tl.store(u_ptr + (rows[:, None] * Hv + h) * Dv + ov[None, :], u, mask=rmask[:, None] & (ov < Dv)[None, :])
    tl.store(gc_ptr + rows * Hv + h, gc, mask=rmask)


@triton.jit
def gdn_chunk_state_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, state_ptr, o_ptr, pos_ptr, slots_ptr,
    T, Hv, REP, Dk, Dv, scale, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ss, stride_sh, stride_ot, stride_oh,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    h = tl.program_id(0)
    vb = tl.program_id(1)
    hk = h // REP
    s = tl.load(slots_ptr).to(tl.int64)
    p0 = tl.load(pos_ptr)
    ok = tl.arange(0, BK)
    ov = vb * BV + tl.arange(0, BV)
    kmask = ok < Dk
    vmask = ov < Dv
    sptrs = state_ptr + s * stride_ss + h * stride_sh + ok[:, None] * Dv + ov[None, :]
    smask = kmask[:, None] & vmask[None, :]
    S = tl.load(sptrs, mask=smask, other=0.0)  # [BK, BV]
    S = tl.where(p0 > 0, S, 0.0)  # position 0 starts from a zero state
    ri = tl.arange(0, BT)
    causal = ri[:, None] >= ri[None, :]
    for c in range(0, tl.cdiv(T, BT)):
        rows = c * BT + ri
        rmask = rows < T
        k = tl.load(k_ptr + rows[:, None] * stride_kt + hk * stride_kh + ok[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        k = k * tl.rsqrt(tl.sum(k * k, axis=1) + eps)[:, None]
        q = tl.load(q_ptr + rows[:, None] * stride_qt + hk * stride_qh + ok[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        q = q * (tl.rsqrt(tl.sum(q * q, axis=1) + eps) * scale)[:, None]
        gc = tl.load(gc_ptr + rows * Hv + h, mask=rmask, other=0.0)
        gl = tl.sum(tl.where(ri == tl.minimum(T - 1 - c * BT, BT - 1), gc, 0.0), axis=0)  # last valid
        gc = tl.where(rmask, gc, gl)
        w = tl.load(w_ptr + (rows[:, None] * Hv + h) * Dk + ok[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0)
        u = tl.load(u_ptr + (rows[:, None] * Hv + h) * Dv + ov[None, :],
                    mask=rmask[:, None] & vmask[None, :], other=0.0)
        u = u - tl.dot(w, S, input_precision=PRECISION)  # [BT, BV]
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BT, BT]
        qk = tl.where(causal, qk * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        o = tl.dot(q, S, input_precision=PRECISION) * tl.exp(gc)[:, None] \
            + tl.dot(qk, u, input_precision=PRECISION)
        tl.store(o_ptr + rows[:, None] * stride_ot + h * stride_oh + ov[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=rmask[:, None] & vmask[None, :])
        kd = k * tl.exp(gl - gc)[:, None]
        S = S * tl.exp(gl) + tl.dot(tl.trans(kd), u, input_precision=PRECISION)
    tl.store(sptrs, S, mask=smask)
