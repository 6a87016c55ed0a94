"""Triton kernels of the Gated DeltaNet chunked WY prefill (route gdn_chunked_wy_prefill: WY / UT prep with a
blocked 16x16 inverse, bf16 tensor-core state passing, chunk-parallel output).

Chunk 64 = four 16-row sub-blocks. Notation per chunk and value head: K, Q [64, Dk] L2-normalised
(Q also scaled by 1/sqrt(Dk)), V [64, Dv], beta [64], gc = in-chunk cumulative sum of g (log
decay), gl = gc of the chunk's last valid row, S_c the state [Dk, Dv] at the chunk's start.

gdn_wy_prep_kernel   grid (n_chunks, Hv), chunk-parallel (the WY / UT representation):
                         rk = 1 / ||k|| per row (-> f32 workspace; the later kernels feed raw bf16
                              k / q to the tensor cores and fold the L2 norms in as row scales)
                         A = strictly-lower(beta_i exp(gc_i - gc_j) k_i.k_j)     (10 16x16 blocks)
                         X = (I + A)^-1: the four 16x16 diagonal blocks by forward substitution
                             (16 steps, all four blocks per step), the six off-diagonal blocks by
                             blocked forward substitution X_ij = -X_ii sum_{j<=m<i} A_im X_mj (tl.dot)
                         W = X (beta exp(gc) K), U = X (beta V)   -> bf16 workspace; gc -> f32 workspace
gdn_wy_state_kernel  grid (Hv, cdiv(Dv, BV)), sequential over chunks, the [Dk, BV] state block
                       in fp32 registers, bf16 tensor-core dots with fp32 accumulation:
                         H[c] = S_c (bf16 workspace);   V' = U - W S_c  (overwrites U in place)
                         S_{c+1} = exp(gl) S_c + K_raw^T (rk exp(gl - gc) V')
                       and finally writes S to the slot (position 0: S_0 = 0).
gdn_wy_out_kernel    grid (cdiv(Dv, BV), n_chunks, Hv), chunk-parallel:
                         O = exp(gc) (Q H[c]) + [causal (Q K^T) exp(gc_i - gc_j)] V'

F32 (the CPU interpreter, whose bf16 tl.dot is wrong in Triton 3.9) upcasts the bf16 dot operands
to float32 ("ieee"); on the GPU those dots take bf16 operands.
Workspace (laid out by launch_chunked_wy.chunked_workspace_numel): gc, rk f32 [Hv, T]; W bf16 [Hv, T, Dk];
U / V' bf16 [Hv, T, Dv]; H bf16 [Hv, n_chunks, Dk, Dv].
"""

import triton
import triton.language as tl


@triton.jit
def _bf16(x, F32: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The interpreter (3.9) truncates fp32 -> bf16, so under
    it (F32) the rounding is done on the bits first (then the conversion is exact)."""
    if F32:
        b = x.to(tl.float32).to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _mm(a, b, F32: tl.constexpr):
    """a @ b of bf16 operands, fp32 accumulation (upcast to fp32 'ieee' under F32)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _out(x, ptr, F32: tl.constexpr):
    """x converted to the element type of ptr (bf16 rounded to nearest even)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        return _bf16(x, F32)
    else:
        return x.to(ptr.dtype.element_ty)


@triton.jit
def _mma(a, b, acc, F32: tl.constexpr):
    """acc + a @ b of bf16 operands (upcast to fp32 'ieee' under F32)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _sub_block(k_ptr, g64, beta_ptr, base, i: tl.constexpr, T, Hv, h, hk, Dk, eps, stride_kt, stride_kh,
               BK: tl.constexpr):
    """Rows 16i..16i+15 of the chunk: k [16, BK] raw (fp32), rk [16], gc [16], beta [16]."""
    r16 = tl.arange(0, 16)
    rows = base + 16 * i + r16
    rmask = rows < T
    ok = tl.arange(0, BK)
    kp = k_ptr + (base + 16 * i).to(tl.int64) * stride_kt + hk * stride_kh
    k = tl.load(kp + r16[:, None] * stride_kt + ok[None, :], mask=rmask[:, None] & (ok < Dk)[None, :],
                other=0.0).to(tl.float32)
    rk = tl.rsqrt(tl.sum(k * k, axis=1) + eps)
    c64 = tl.arange(0, 64)
    gc = tl.sum(tl.where(c64[None, :] <= (16 * i + r16)[:, None], g64[None, :], 0.0), axis=1)
    beta = tl.load(beta_ptr + rows * Hv + h, mask=rmask, other=0.0)
    return k, rk, gc, beta


@triton.jit
def _v_block(v_ptr, base, i: tl.constexpr, T, h, Dv, stride_vt, stride_vh, BVF: tl.constexpr):
    r16 = tl.arange(0, 16)
    ov = tl.arange(0, BVF)
    vp = v_ptr + (base + 16 * i).to(tl.int64) * stride_vt + h * stride_vh
    return tl.load(vp + r16[:, None] * stride_vt + ov[None, :],
                   mask=((base + 16 * i + r16) < T)[:, None] & (ov < Dv)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _a_block(ki, kj, gci, gcj, betai, DIAG: tl.constexpr, PRECISION: tl.constexpr):
    """beta_i exp(gc_i - gc_j) k_i.k_j for one 16x16 block (strictly lower when DIAG)."""
    kk = tl.dot(ki, tl.trans(kj), input_precision=PRECISION)
    d = gci[:, None] - gcj[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        low = r[:, None] > r[None, :]
        return tl.where(low, betai[:, None] * kk * tl.exp(tl.where(low, d, 0.0)), 0.0)
    else:
        return betai[:, None] * kk * tl.exp(d)


@triton.jit
def _store16(ptr, row0, T, x, D, BD: tl.constexpr, F32: tl.constexpr):
    """Rows row0..row0+15 (< T) of a bf16 [T, D] workspace slab (ptr = the head's slab)."""
    r16 = tl.arange(0, 16)
    cols = tl.arange(0, BD)
    tl.store(ptr + row0 * D + r16[:, None] * D + cols[None, :], _bf16(x, F32),
             mask=((row0 + r16) < T)[:, None] & (cols < D)[None, :])


@triton.jit
def gdn_wy_prep_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, gc_ptr, rk_ptr, w_ptr, u_ptr,
    T, Hv, REP, Dk, Dv, eps,
    stride_kt, stride_kh, stride_vt, stride_vh,
    BK: tl.constexpr, BVF: tl.constexpr, PRECISION: tl.constexpr, F32: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // REP
    hl = h.to(tl.int64)
    base = c * 64
    c64 = base + tl.arange(0, 64)
    g64 = tl.load(g_ptr + c64 * Hv + h, mask=c64 < T, other=0.0)
    k0, rk0, gc0, b0 = _sub_block(k_ptr, g64, beta_ptr, base, 0, T, Hv, h, hk, Dk, eps, stride_kt, stride_kh, BK)
    k1, rk1, gc1, b1 = _sub_block(k_ptr, g64, beta_ptr, base, 1, T, Hv, h, hk, Dk, eps, stride_kt, stride_kh, BK)
    k2, rk2, gc2, b2 = _sub_block(k_ptr, g64, beta_ptr, base, 2, T, Hv, h, hk, Dk, eps, stride_kt, stride_kh, BK)
    k3, rk3, gc3, b3 = _sub_block(k_ptr, g64, beta_ptr, base, 3, T, Hv, h, hk, Dk, eps, stride_kt, stride_kh, BK)
    r = tl.arange(0, 16)
    gp = gc_ptr + hl * T + base
    rp = rk_ptr + hl * T + base
    tl.store(gp + r, gc0, mask=base + r < T)
    tl.store(gp + 16 + r, gc1, mask=base + 16 + r < T)
    tl.store(gp + 32 + r, gc2, mask=base + 32 + r < T)
    tl.store(gp + 48 + r, gc3, mask=base + 48 + r < T)
    tl.store(rp + r, rk0, mask=base + r < T)
    tl.store(rp + 16 + r, rk1, mask=base + 16 + r < T)
    tl.store(rp + 32 + r, rk2, mask=base + 32 + r < T)
    tl.store(rp + 48 + r, rk3, mask=base + 48 + r < T)
    k0 = k0 * rk0[:, None]
    k1 = k1 * rk1[:, None]
    k2 = k2 * rk2[:, None]
    k3 = k3 * rk3[:, None]
    # A blocks (row block, column block); padded rows have beta = 0 -> zero rows
    a00 = _a_block(k0, k0, gc0, gc0, b0, True, PRECISION)
    a11 = _a_block(k1, k1, gc1, gc1, b1, True, PRECISION)
    a22 = _a_block(k2, k2, gc2, gc2, b2, True, PRECISION)
    a33 = _a_block(k3, k3, gc3, gc3, b3, True, PRECISION)
    a10 = _a_block(k1, k0, gc1, gc0, b1, False, PRECISION)
    a20 = _a_block(k2, k0, gc2, gc0, b2, False, PRECISION)
    a21 = _a_block(k2, k1, gc2, gc1, b2, False, PRECISION)
    a30 = _a_block(k3, k0, gc3, gc0, b3, False, PRECISION)
    a31 = _a_block(k3, k1, gc3, gc1, b3, False, PRECISION)
    a32 = _a_block(k3, k2, gc3, gc2, b3, False, PRECISION)
    # diagonal 16x16 inverses (I + A_ii)^-1, all four blocks per step:
    # row i of X_ii = e_i - sum_{j<i} A_ii[i, j] X_ii[j, :]
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    x00 = eye
    x11 = eye
    x22 = eye
    x33 = eye
    for i in range(1, 16):
        sel = r[:, None] == i
        x00 = tl.where(sel, x00 - tl.sum(tl.sum(tl.where(sel, a00, 0.0), axis=0)[:, None] * x00, axis=0)[None, :], x00)
        x11 = tl.where(sel, x11 - tl.sum(tl.sum(tl.where(sel, a11, 0.0), axis=0)[:, None] * x11, axis=0)[None, :], x11)
        x22 = tl.where(sel, x22 - tl.sum(tl.sum(tl.where(sel, a22, 0.0), axis=0)[:, None] * x22, axis=0)[None, :], x22)
        x33 = tl.where(sel, x33 - tl.sum(tl.sum(tl.where(sel, a33, 0.0), axis=0)[:, None] * x33, axis=0)[None, :], x33)
    # off-diagonal blocks by blocked forward substitution, X_ij = -X_ii sum_{j<=m<i} A_im X_mj,
    # fp32 "ieee" 16x16 products (cheap; keeps the inverse accurate)
    x10 = -tl.dot(x11, tl.dot(a10, x00, input_precision="ieee"), input_precision="ieee")
    x21 = -tl.dot(x22, tl.dot(a21, x11, input_precision="ieee"), input_precision="ieee")
    x32 = -tl.dot(x33, tl.dot(a32, x22, input_precision="ieee"), input_precision="ieee")
    t = tl.dot(a21, x10, tl.dot(a20, x00, input_precision="ieee"), input_precision="ieee")
    x20 = -tl.dot(x22, t, input_precision="ieee")
    t = tl.dot(a32, x21, tl.dot(a31, x11, input_precision="ieee"), input_precision="ieee")
    x31 = -tl.dot(x33, t, input_precision="ieee")
    t = tl.dot(a32, x20, tl.dot(a31, x10, tl.dot(a30, x00, input_precision="ieee"), input_precision="ieee"),
               input_precision="ieee")
    x30 = -tl.dot(x33, t, input_precision="ieee")
    # W = X (beta exp(gc) K), row block by row block (row block i = sum_{j<=i} X_ij kb_j)
    k0 = k0 * (b0 * tl.exp(gc0))[:, None]
    k1 = k1 * (b1 * tl.exp(gc1))[:, None]
    k2 = k2 * (b2 * tl.exp(gc2))[:, None]
    k3 = k3 * (b3 * tl.exp(gc3))[:, None]
    wp = w_ptr + hl * T * Dk
    _store16(wp, base, T, tl.dot(x00, k0, input_precision=PRECISION), Dk, BK, F32)
    acc = tl.dot(x10, k0, input_precision=PRECISION)
    _store16(wp, base + 16, T, tl.dot(x11, k1, acc, input_precision=PRECISION), Dk, BK, F32)
    acc = tl.dot(x21, k1, tl.dot(x20, k0, input_precision=PRECISION), input_precision=PRECISION)
    _store16(wp, base + 32, T, tl.dot(x22, k2, acc, input_precision=PRECISION), Dk, BK, F32)
    acc = tl.dot(x31, k1, tl.dot(x30, k0, input_precision=PRECISION), input_precision=PRECISION)
    acc = tl.dot(x32, k2, acc, input_precision=PRECISION)
    _store16(wp, base + 48, T, tl.dot(x33, k3, acc, input_precision=PRECISION), Dk, BK, F32)
    # U = X (beta V)
    v0 = _v_block(v_ptr, base, 0, T, h, Dv, stride_vt, stride_vh, BVF) * b0[:, None]
    v1 = _v_block(v_ptr, base, 1, T, h, Dv, stride_vt, stride_vh, BVF) * b1[:, None]
    v2 = _v_block(v_ptr, base, 2, T, h, Dv, stride_vt, stride_vh, BVF) * b2[:, None]
    v3 = _v_block(v_ptr, base, 3, T, h, Dv, stride_vt, stride_vh, BVF) * b3[:, None]
    up = u_ptr + hl * T * Dv
    _store16(up, base, T, tl.dot(x00, v0, input_precision=PRECISION), Dv, BVF, F32)
    acc = tl.dot(x10, v0, input_precision=PRECISION)
    _store16(up, base + 16, T, tl.dot(x11, v1, acc, input_precision=PRECISION), Dv, BVF, F32)
    acc = tl.dot(x21, v1, tl.dot(x20, v0, input_precision=PRECISION), input_precision=PRECISION)
    _store16(up, base + 32, T, tl.dot(x22, v2, acc, input_precision=PRECISION), Dv, BVF, F32)
    acc = tl.dot(x31, v1, tl.dot(x30, v0, input_precision=PRECISION), input_precision=PRECISION)
    acc = tl.dot(x32, v2, acc, input_precision=PRECISION)
    _store16(up, base + 48, T, tl.dot(x33, v3, acc, input_precision=PRECISION), Dv, BVF, F32)


@triton.jit
def _chunk_vecs(gc_ptr, rk_ptr, off, c, T):
    """gc of the chunk's 64 rows (padded rows get the last valid row's gc), gl (that last gc) and
    rk (padded rows 0); off = h * T + 64 c."""
    ri = tl.arange(0, 64)
    rmask = c * 64 + ri < T
    gc = tl.load(gc_ptr + off + ri, mask=rmask, other=0.0)
    gl = tl.sum(tl.where(ri == tl.minimum(T - 1 - c * 64, 63), gc, 0.0), axis=0)
    rk = tl.load(rk_ptr + off + ri, mask=rmask, other=0.0)
    return tl.where(rmask, gc, gl), gl, rk


@triton.jit
def gdn_wy_state_kernel(
    k_ptr, gc_ptr, rk_ptr, w_ptr, u_ptr, h_ptr, state_ptr, pos_ptr, slots_ptr,
    T, NT, Hv, REP, Dk, Dv,
    stride_kt, stride_kh, stride_ss, stride_sh,
    BK: tl.constexpr, BV: tl.constexpr, F32: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    hk = h // REP
    hl = h.to(tl.int64)
    s = tl.load(slots_ptr).to(tl.int64)
    p0 = tl.load(pos_ptr)
    ok = tl.arange(0, BK)
    ov = vb * BV + tl.arange(0, BV)
    kmask = ok < Dk
    vmask = ov < Dv
    smask = kmask[:, None] & vmask[None, :]
    soff = ok[:, None] * Dv + ov[None, :]
    sp = state_ptr + s * stride_ss + h * stride_sh
    S = tl.load(sp + soff, mask=smask, other=0.0)  # [BK, BV] fp32
    S = tl.where(p0 > 0, S, 0.0)  # position 0 starts from a zero state
    ri = tl.arange(0, 64)
    hp = h_ptr + hl * NT * Dk * Dv
    kp = k_ptr + hk * stride_kh
    wp = w_ptr + hl * T * Dk
    up = u_ptr + hl * T * Dv
    for c in tl.range(0, NT, num_stages=NUM_STAGES):
        tl.store(hp + soff, _bf16(S, F32), mask=smask)
        rmask = c * 64 + ri < T
        kr = tl.load(kp + ri[:, None] * stride_kt + ok[None, :], mask=rmask[:, None] & kmask[None, :],
                     other=0.0)  # raw k [64, BK] bf16
        w = tl.load(wp + ri[:, None] * Dk + ok[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        uoff = ri[:, None] * Dv + ov[None, :]
        umask = rmask[:, None] & vmask[None, :]
        u = tl.load(up + uoff, mask=umask, other=0.0).to(tl.float32)
        gc, gl, rk = _chunk_vecs(gc_ptr, rk_ptr, hl * T + c * 64, c, T)
        vn = u - _mm(w, _bf16(S, F32), F32)  # V' = U - W S  [64, BV]
        tl.store(up + uoff, _bf16(vn, F32), mask=umask)
        vs = _bf16(vn * (rk * tl.exp(gl - gc))[:, None], F32)
        S = _mma(tl.trans(kr), vs, S * tl.exp(gl), F32)  # exp(gl) S + (K exp(gl - gc))^T V'
        hp += Dk * Dv
        kp += 64 * stride_kt
        wp += 64 * Dk
        up += 64 * Dv
    tl.store(sp + soff, S, mask=smask)


@triton.jit
def gdn_wy_out_kernel(
    q_ptr, k_ptr, gc_ptr, rk_ptr, u_ptr, h_ptr, o_ptr,
    T, NT, Hv, REP, Dk, Dv, scale, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
    BK: tl.constexpr, BV: tl.constexpr, F32: tl.constexpr,
):
    vb = tl.program_id(0)
    c = tl.program_id(1)
    h = tl.program_id(2)
    hk = h // REP
    hl = h.to(tl.int64)
    ri = tl.arange(0, 64)
    rmask = c * 64 + ri < T
    row0 = (c * 64).to(tl.int64)
    ok = tl.arange(0, BK)
    ov = vb * BV + tl.arange(0, BV)
    kmask = ok < Dk
    vmask = ov < Dv
    q = tl.load(q_ptr + row0 * stride_qt + hk * stride_qh + ri[:, None] * stride_qt + ok[None, :],
                mask=rmask[:, None] & kmask[None, :], other=0.0)  # raw q [64, BK] bf16
    qf = q.to(tl.float32)
    rq = tl.rsqrt(tl.sum(qf * qf, axis=1) + eps) * scale
    kr = tl.load(k_ptr + row0 * stride_kt + hk * stride_kh + ri[:, None] * stride_kt + ok[None, :],
                 mask=rmask[:, None] & kmask[None, :], other=0.0)  # raw k [64, BK] bf16
    gc, gl, rk = _chunk_vecs(gc_ptr, rk_ptr, hl * T + c * 64, c, T)
    hs = tl.load(h_ptr + (hl * NT + c) * Dk * Dv + ok[:, None] * Dv + ov[None, :],
                 mask=kmask[:, None] & vmask[None, :], other=0.0)  # [BK, BV] bf16
    vn = tl.load(u_ptr + hl * T * Dv + row0 * Dv + ri[:, None] * Dv + ov[None, :],
                 mask=rmask[:, None] & vmask[None, :], other=0.0)  # V' [64, BV] bf16
    qk = _mm(q, tl.trans(kr), F32)  # raw [64, 64]
    causal = ri[:, None] >= ri[None, :]
    qk = tl.where(causal, qk * (rq[:, None] * rk[None, :]) * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)),
                  0.0)
    o = _mm(q, hs, F32) * (rq * tl.exp(gc))[:, None]
    o = _mma(_bf16(qk, F32), vn, o, F32)
    tl.store(o_ptr + row0 * stride_ot + h * stride_oh + ri[:, None] * stride_ot + ov[None, :],
             _out(o, o_ptr, F32), mask=rmask[:, None] & vmask[None, :])
