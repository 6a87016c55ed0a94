"""Triton kernels of the causal depthwise conv1d (+SiLU) with a per-slot rolling state.

Grid (T, cdiv(C, BLOCK_C)): one program per (column, channel block). The K taps are a
[KP, BLOCK_C] block (KP = next power of two >= K); tap j reads the input at lag d = K-1-j, from
x when the column has at least d same-slot predecessors in this launch (n_prev), else from the
slot's state row K-1-(d-n_prev); inputs at negative positions are zero.

The input may come in up to three channel ranges (PARTS): channels [0, C0) from x, [C0, C01) from
x1, [C01, C) from x2, each with its own row stride — the GDN conv reads q, k and v straight from
the projections' outputs instead of from a concatenated copy (fuse rule `conv_input_parts`).

`conv1d_kernel` with FUSE_STATE=True also rolls the state in the same program: valid only when
every column has its own slot (decode). The prefill path runs `conv1d_kernel` (FUSE_STATE=False)
then `conv1d_state_kernel`, in which only the last column of each slot's run writes that slot's
state, after all reads of the old state have completed (stream order).

`conv1d_verify_kernel`, grid (C rows, C_ch blocks): a verify row is W consecutive columns of one
slot (columns r*W .. r*W+W-1, W a constexpr: one compile per draft window); the program loads the
row's inputs once (its K-1 state rows and W columns, before any store, so the loads do not wait on
the stores of earlier columns), then computes the W outputs, the row's last K-1 inputs after each of
its first W-1 columns (conv_state_columns[r, j]) and, after a barrier, the final state in place.
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def _n_prev(slots_ptr, t, s, K: tl.constexpr):
    """Number of consecutive same-slot columns right before column t (capped at K-1)."""
    n = t * 0
    alive = t * 0 + 1
    for d in tl.static_range(1, K):
        tp = t - d
        sp = tl.load(slots_ptr + tl.maximum(tp, 0))
        ok = ((tp >= 0) & (sp == s)).to(tl.int32)
        alive = alive * ok
        n += alive
    return n


@triton.jit
def _x_rows(xp, xrow, cols, m, PARTS: tl.constexpr):
    """x at rows xrow ([R]) for channels cols -> [R, BLOCK_C] (0 where ~m), from the PARTS ranges;
    xp = (x_ptr, stride_xt, x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01)."""
    x_ptr, sx, x1_ptr, sx1, x2_ptr, sx2, C0, C01 = xp
    if PARTS == 1:
        v = tl.load(x_ptr + xrow[:, None] * sx + cols[None, :], mask=m, other=0.0)
    else:
        in0 = (cols < C0)[None, :]
        in2 = (cols >= C01)[None, :]
        v = tl.load(x_ptr + xrow[:, None] * sx + cols[None, :], mask=m & in0, other=0.0)
        v += tl.load(x1_ptr + xrow[:, None] * sx1 + (cols - C0)[None, :], mask=m & ~in0 & ~in2, other=0.0)
        if PARTS == 3:
            v += tl.load(x2_ptr + xrow[:, None] * sx2 + (cols - C01)[None, :], mask=m & in2, other=0.0)
    return v


@triton.jit
def _lagged(xp, state_ptr, t, s, p, n_prev, d, cols, cmask, stride_ss, stride_sk,
            K: tl.constexpr, PARTS: tl.constexpr):
    """Inputs at lags d ([R] int tensor) for channels cols -> [R, BLOCK_C] fp32 (zero where d < 0)."""
    from_x = d <= n_prev
    valid = ((p - d) >= 0) & (d >= 0) & (d < K)
    m = cmask[None, :] & valid[:, None]
    xrow = tl.maximum(t - d, 0)
    vx = _x_rows(xp, xrow, cols, m & from_x[:, None], PARTS)
    srow = tl.minimum(tl.maximum(K - 1 - (d - n_prev), 0), K - 2)
    vs = tl.load(state_ptr + s * stride_ss + srow[:, None] * stride_sk + cols[None, :],
                 mask=m & (d > n_prev)[:, None], other=0.0)
    return vx.to(tl.float32) + vs.to(tl.float32)


@triton.jit
def _roll_state(xp, state_ptr, t, s, p, n_prev, cols, cmask, stride_ss, stride_sk,
                K: tl.constexpr, KP: tl.constexpr, PARTS: tl.constexpr):
    """Write slot s's new state as of column t: row i holds the input at lag K-2-i (row K-2 =
    column t), read through `_lagged` before any row is overwritten."""
    i = tl.arange(0, KP)
    dn = K - 2 - i
    rmask = (i < K - 1)[:, None] & cmask[None, :]
    nv = _lagged(xp, state_ptr, t, s, p, n_prev, dn, cols, cmask, stride_ss, stride_sk, K, PARTS)
    tl.debug_barrier()
    tl.store(state_ptr + s * stride_ss + i[:, None] * stride_sk + cols[None, :],
             nv.to(state_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def conv1d_kernel(
    x_ptr, w_ptr, state_ptr, out_ptr, pos_ptr, slots_ptr,
    C, stride_xt, stride_ot, stride_ss, stride_sk,
    x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, FUSE_STATE: tl.constexpr,
    PARTS: tl.constexpr = 1,
    SILU: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    xp = (x_ptr, stride_xt, x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    s = tl.load(slots_ptr + t)
    p = tl.load(pos_ptr + t)
    if FUSE_STATE:
        n_prev = t * 0
    else:
        n_prev = _n_prev(slots_ptr, t, s, K)
    j = tl.arange(0, KP)
    d = K - 1 - j  # lag of tap j; taps j >= K give d < 0 and are masked off
    vals = _lagged(xp, state_ptr, t, s, p, n_prev, d, cols, cmask, stride_ss, stride_sk, K, PARTS)
    w = tl.load(w_ptr + j[:, None] * C + cols[None, :], mask=(j < K)[:, None] & cmask[None, :], other=0.0)
    acc = tl.sum(vals * w.to(tl.float32), axis=0)  # [BLOCK_C]
    if SILU:
        y = acc / (1.0 + tl.exp(-acc))
    else:
        y = acc
    tl.store(out_ptr + t * stride_ot + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)
    if FUSE_STATE:
        _roll_state(xp, state_ptr, t, s, p, n_prev, cols, cmask, stride_ss, stride_sk, K, KP, PARTS)


@triton.jit
def conv1d_state_kernel(
    x_ptr, state_ptr, pos_ptr, slots_ptr,
    T, C, stride_xt, stride_ss, stride_sk,
    x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr,
    PARTS: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):
    """Grid (T, C blocks): the last column of each slot's run writes that slot's new state."""
    pdl_enter(PDL)
    xp = (x_ptr, stride_xt, x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    s = tl.load(slots_ptr + t)
    nxt = tl.load(slots_ptr + tl.minimum(t + 1, T - 1))
    is_end = (t == T - 1) | (nxt != s)
    if is_end:
        p = tl.load(pos_ptr + t)
        n_prev = _n_prev(slots_ptr, t, s, K)
        _roll_state(xp, state_ptr, t, s, p, n_prev, cols, cmask, stride_ss, stride_sk, K, KP, PARTS)


@triton.jit
def _row_of(E, e_idx, e):
    """Row e of the register tile E [EP, BLOCK_C] (exact: one term, the rest zeros) -> [BLOCK_C]."""
    return tl.sum(tl.where((e_idx == e)[:, None], E, 0.0), axis=0)


@triton.jit
def conv1d_verify_kernel(
    x_ptr, w_ptr, state_ptr, out_ptr, pos_ptr, slots_ptr, cols_ptr,
    C, stride_xt, stride_ot, stride_ss, stride_sk, stride_cr, stride_cj, stride_ck,
    x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01,
    W: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr, BLOCK_C: tl.constexpr,
    PARTS: tl.constexpr = 1,
    SILU: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    """The row's whole input sequence E = [its K-1 state rows | its W new columns] ([EP, BLOCK_C], rows
    at negative positions zero) is loaded once, before any store; column j's taps are E rows j .. j+K-1
    (the same [KP, BLOCK_C] tile and tl.sum as conv1d_kernel, so verify and decode outputs agree bit for
    bit), the state after column j is E rows j+1 .. j+K-1, the final state E rows W .. W+K-2."""
    pdl_enter(PDL)
    xp = (x_ptr, stride_xt, x1_ptr, stride_x1, x2_ptr, stride_x2, C0, C01)
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    t0 = r * W
    s = tl.load(slots_ptr + t0)
    p0 = tl.load(pos_ptr + t0)
    e = tl.arange(0, EP)  # E row e holds the input at position p0 - (K-1) + e
    live = (e < K - 1 + W) & (p0 - (K - 1) + e >= 0)
    from_state = e < K - 1
    m = live[:, None] & cmask[None, :]
    vs = tl.load(state_ptr + s * stride_ss + tl.minimum(e, K - 2)[:, None] * stride_sk + cols[None, :],
                 mask=m & from_state[:, None], other=0.0)
    vx = _x_rows(xp, t0 + tl.maximum(e - (K - 1), 0), cols, m & ~from_state[:, None], PARTS)
    E = vs.to(tl.float32) + vx.to(tl.float32)  # [EP, BLOCK_C]
    i = tl.arange(0, KP)
    w = tl.load(w_ptr + i[:, None] * C + cols[None, :], mask=(i < K)[:, None] & cmask[None, :], other=0.0)
    w = w.to(tl.float32)  # [KP, BLOCK_C]
    cb = cols_ptr + r.to(tl.int64) * stride_cr + cols[None, :]
    for j in tl.static_range(W):
        vals = tl.zeros([KP, BLOCK_C], dtype=tl.float32)
        for tap in tl.static_range(K):
            vals = tl.where((i == tap)[:, None], _row_of(E, e, j + tap)[None, :], vals)
        acc = tl.sum(vals * w, axis=0)  # [BLOCK_C]
        if SILU:
            y = acc / (1.0 + tl.exp(-acc))
        else:
            y = acc
        tl.store(out_ptr + (t0 + j) * stride_ot + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)
        if j < W - 1:  # the row's last K-1 inputs after column j (the rollback's column j): E rows j+1 ..
            sel = (e >= j + 1) & (e < j + K)
            tl.store(cb + j * stride_cj + (e - j - 1)[:, None] * stride_ck, E.to(cols_ptr.dtype.element_ty),
                     mask=sel[:, None] & cmask[None, :])
    tl.debug_barrier()  # every read of the old state is done before the final state overwrites it
    fin = (e >= W) & (e < W + K - 1)
    tl.store(state_ptr + s * stride_ss + (e - W)[:, None] * stride_sk + cols[None, :],
             E.to(state_ptr.dtype.element_ty), mask=fin[:, None] & cmask[None, :])
