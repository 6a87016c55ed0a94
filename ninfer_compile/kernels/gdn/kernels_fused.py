"""Triton kernel of route gdn_decode_fused_keyhead: one GDN decode step after the projections.

gdn_fused_decode_kernel, grid (T, Hk): program (t, hk) owns column t (its own slot s) and key head
hk with ALL its REP = Hv / Hk value heads, i.e. every conv channel of that group:
    q channels [hk*Dk, +Dk), k channels [Hk*Dk + hk*Dk, +Dk), v channels [2*Hk*Dk + h*Dv, +Dv)
    for h = hk*REP .. hk*REP + REP-1.
  1. causal conv (K taps over the slot's K-1 state rows + the new input) + SiLU of its q and k
     channels, L2 norm (q also times `scale`); the q / k conv-state roll is written by this
     program only (after a CTA barrier: every read of the old rows is done);
  2. per value head h: the v channels' conv (+ their state roll), the recurrent step on the
     [Dk, Dv] f32 state block in registers (decay, delta update, o = S^T q), then the gated
     RMSNorm epilogue over the head's whole value row: out = o * rsqrt(mean(o^2) + eps) * w * silu(z).
The conv outputs and o are rounded to the output's dtype where the unfused ops store them, and
every step keeps the unfused kernels' operation order (conv1d_kernel, gdn_decode_kernel,
gated_rmsnorm_kernel): a verify round (unfused, docs/SPECULATIVE.md) and a plain decode step agree.
Why (t, hk) and not (t, h, value block) like gdn_decode_kernel: the q / k conv state of key head hk
is read by all REP value heads; a program per value head would race its roll against the other
heads' reads (no grid-wide barrier inside a launch), and a value block smaller than Dv would need a
cross-program reduction for the norm. Owning the whole group makes every state write single-owner.
PREFETCH: the next value head's state block is loaded before the current one is computed (two
[Dk, Dv] f32 blocks live), so the REP heads' loads overlap. Registers at Dk = Dv = 128 (ptxas sm_90a,
triton 3.9): 16 warps 128 per thread + 392 B spills (560 B with PREFETCH); 8 warps 255 + 988 B (4.3 KB).
Only for decode columns (each column its own slot, one column per slot).
"""

import triton
import triton.language as tl

from ..pdl import pdl_enter


@triton.jit
def _conv_window(x_ptr, cst_ptr, stride_ck, w_ptr, C, ch0, offs, D, p,
                 K: tl.constexpr, KP: tl.constexpr, SILU: tl.constexpr):
    """Channels ch0 + offs (offs < D) of one column: returns (y [BD] f32, win [KP, BD] f32) with
    win row i (< K-1) = state row i (the input at lag K-1-i; zero at a negative position),
    row K-1 = the new input x_ptr[offs], y = act(sum_i w[i] * win[i])."""
    i = tl.arange(0, KP)
    dm = offs < D
    ch = ch0 + offs
    lag = K - 1 - i
    sm = ((i < K - 1) & (p - lag >= 0))[:, None] & dm[None, :]
    win = tl.load(cst_ptr + i[:, None] * stride_ck + ch[None, :], mask=sm, other=0.0).to(tl.float32)
    xv = tl.load(x_ptr + offs, mask=dm, other=0.0).to(tl.float32)  # [BD]
    win = tl.where((i == K - 1)[:, None], xv[None, :], win)
    w = tl.load(w_ptr + i[:, None] * C + ch[None, :], mask=(i < K)[:, None] & dm[None, :], other=0.0)
    acc = tl.sum(win * w.to(tl.float32), axis=0)  # [BD]
    if SILU:
        y = acc / (1.0 + tl.exp(-acc))
    else:
        y = acc
    return y, win


@triton.jit
def _roll(cst_ptr, stride_ck, win, ch0, offs, D, K: tl.constexpr, KP: tl.constexpr):
    """New state rows of channels ch0 + offs: row i-1 = win row i (i = 1 .. K-1). The caller puts a
    CTA barrier between the window's loads and this store."""
    i = tl.arange(0, KP)
    m = ((i >= 1) & (i < K))[:, None] & (offs < D)[None, :]
    tl.store(cst_ptr + (i - 1)[:, None] * stride_ck + (ch0 + offs)[None, :],
             win.to(cst_ptr.dtype.element_ty), mask=m)


@triton.jit
def gdn_fused_decode_kernel(
    xq_ptr, xk_ptr, xv_ptr, cw_ptr, cstate_ptr, g_ptr, beta_ptr, state_ptr, pos_ptr, slots_ptr,
    z_ptr, nw_ptr, out_ptr,
    C, Hk, Hv, REP, Dk, Dv, scale, l2_eps, eps,
    stride_xq, stride_xk, stride_xv, stride_cs, stride_ck, stride_ss, stride_sh,
    stride_zt, stride_zh, stride_ot,
    K: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SILU: tl.constexpr,
    PREFETCH: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.load(slots_ptr + t).to(tl.int64)
    p = tl.load(pos_ptr + t)
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    kmask = ok < Dk
    vmask = ov < Dv
    cst = cstate_ptr + s * stride_cs
    qch = hk * Dk
    kch = Hk * Dk + hk * Dk
    q, qwin = _conv_window(xq_ptr + t * stride_xq + hk * Dk, cst, stride_ck, cw_ptr, C, qch, ok, Dk, p, K, KP, SILU)
    k, kwin = _conv_window(xk_ptr + t * stride_xk + hk * Dk, cst, stride_ck, cw_ptr, C, kch, ok, Dk, p, K, KP, SILU)
    tl.debug_barrier()  # every read of the old q / k rows is done (this program is their only reader)
    _roll(cst, stride_ck, qwin, qch, ok, Dk, K, KP)
    _roll(cst, stride_ck, kwin, kch, ok, Dk, K, KP)
    # rounded where the unfused ops store their outputs (conv1d's out, the rule's out: the output's
    # dtype), and in their operation order, so decode's fused step and verify's unfused ops agree
    q = q.to(out_ptr.dtype.element_ty).to(tl.float32)
    k = k.to(out_ptr.dtype.element_ty).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + l2_eps) * scale  # [BK]
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + l2_eps)
    nw = tl.load(nw_ptr + ov, mask=vmask, other=0.0).to(tl.float32)  # [BV]
    smask = kmask[:, None] & vmask[None, :]
    sbase = state_ptr + s * stride_ss + ok[:, None] * Dv + ov[None, :]  # head 0's [BK, BV] block
    if PREFETCH:  # head h+1's state block is in flight while head h computes
        S_next = tl.load(sbase + (hk * REP) * stride_sh, mask=smask, other=0.0)
    else:
        S_next = tl.zeros([BK, BV], dtype=tl.float32)
    for j in range(0, REP):
        h = hk * REP + j
        sptrs = sbase + h * stride_sh
        if PREFETCH:
            S = S_next
            more = ok < tl.minimum(Dk, (REP - 1 - j) * Dk)  # all rows while a next head exists, else none
            S_next = tl.load(sptrs + stride_sh, mask=more[:, None] & vmask[None, :], other=0.0)
        else:
            S = tl.load(sptrs, mask=smask, other=0.0)  # [BK, BV] f32
        vch = 2 * Hk * Dk + h * Dv
        v, vwin = _conv_window(xv_ptr + t * stride_xv + h * Dv, cst, stride_ck, cw_ptr, C, vch, ov, Dv, p,
                               K, KP, SILU)
        v = v.to(out_ptr.dtype.element_ty).to(tl.float32)
        gv = tl.load(g_ptr + t * Hv + h)
        bv = tl.load(beta_ptr + t * Hv + h)
        S = tl.where(p > 0, S, 0.0)  # position 0 starts from a zero state
        S = S * tl.exp(gv)
        u = bv * (v - tl.sum(S * k[:, None], axis=0))  # [BV]
        S = S + k[:, None] * u[None, :]
        o = tl.sum(S * q[:, None], axis=0)  # [BV]
        o = o.to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(sptrs, S, mask=smask)
        tl.debug_barrier()  # the v rows of head h: read above by this program only
        _roll(cst, stride_ck, vwin, vch, ov, Dv, K, KP)
        zv = tl.load(z_ptr + t * stride_zt + h * stride_zh + ov, mask=vmask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(o * o, axis=0) / Dv + eps)
        y = o * rstd * nw * (zv / (1.0 + tl.exp(-zv)))
        tl.store(out_ptr + t * stride_ot + h * Dv + ov, y.to(out_ptr.dtype.element_ty), mask=vmask)
