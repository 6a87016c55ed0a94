"""Triton kernels of the MoE families.

Router, one launch either way: `moe_router_kernel` (prefill) runs one program per token row over
all E + 1 logits (router rows and the shared-expert gate row, any linear weight format through the
linear family's `dequant_tile`); `moe_router_split_kernel` (decode, T <= 16) splits the rows over
many programs, each reading its rows once for all T tokens, and the last program to arrive routes
the tokens. Routing (`_route_token`): softmax over the E router logits, top-k by k rounds of arg-max
(ties to the lower expert id), renormalised weights, sigmoid of the shared gate.

Experts (`moe_experts` routes, four launches; see launch.py for the why):

1. `moe_group_kernel` (one program): groups the P = T*k (token, slot) pairs by expert, stably
   (expert-major, then pair order), with one-hot [CHUNK, BLOCK_E] tiles and cumulative sums (no
   atomics, deterministic). Writes `offsets[E+1]` (the first sorted position of each expert),
   `sorted_pairs[P]` and `tile_end[E]`: the running sum of `cdiv(count_e, BLOCK_T)` tiles, so that
   tile g belongs to the expert e with tile_end[e-1] <= g < tile_end[e].
2. `moe_gate_up_kernel`, grid (tile slots, I blocks): a tile is up to BLOCK_T pairs of ONE expert;
   the program finds its expert by counting `tile_end <= g`, reads that expert's gate and up rows of
   the stored bank once per K step (dequantized tiles) and applies them to all of the tile's pairs'
   token rows; SwiGLU in fp32 into `act[pair, I]`. Tile slots past the run's tile count exit at once.
3. `moe_down_kernel`, grid (tile slots, H blocks): the same tiles over the down bank, `y[pair, H]`.
4. `moe_combine_kernel`, grid (T, H blocks): out = residual + shared_gate * shared + sum_j w_j y_j,
   summed in slot order (deterministic).

`USE_DOT` picks the tile product: broadcast FMAs (decode, few pairs per tile) or `tl.dot` on bf16
tiles (the grouped GEMM of prefill; fp32 operands under the interpreter, `DOT_F32`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..linear.dequant import dequant_tile
from ..linear.epilogue import fence_gpu
from ..pdl import pdl_enter


@triton.jit
def _route_token(logits, ev, E, t, ids_ptr, w_ptr, gate_ptr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_TOPK: tl.constexpr):
    """Token t from its E + 1 logits [BLOCK_E]: softmax over rows 0..E-1, top-k by k arg-max rounds
    (ties to the lower id), renormalised weights; sigmoid of row E (the shared gate)."""
    gate = tl.sum(tl.where(ev == E, logits, 0.0), axis=0)
    lg = tl.where(ev < E, logits, float("-inf"))
    p = tl.exp(lg - tl.max(lg, axis=0))
    p = p / tl.sum(p, axis=0)
    kv = tl.arange(0, BLOCK_TOPK)
    sel_ids = tl.zeros([BLOCK_TOPK], tl.int32)
    sel_w = tl.zeros([BLOCK_TOPK], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        idx = tl.min(tl.where(p == best, ev, BLOCK_E), axis=0)
        sel_ids = tl.where(kv == j, idx, sel_ids)
        sel_w = tl.where(kv == j, best, sel_w)
        p = tl.where(ev == idx, -1.0, p)
    sel_w = sel_w / tl.sum(sel_w, axis=0)
    kmask = kv < TOP_K
    tl.store(ids_ptr + t * TOP_K + kv, sel_ids, mask=kmask)
    tl.store(w_ptr + t * TOP_K + kv, sel_w, mask=kmask)
    tl.store(gate_ptr + t, 1.0 / (1.0 + tl.exp(-gate)))


@triton.jit
def moe_router_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, ids_ptr, w_ptr, gate_ptr,
                      E, K, KW_TOTAL, K_LOOP, base_row, high_row, scale_row, sx,
                      TOP_K: tl.constexpr, FMT: tl.constexpr, BLOCK_E: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_TOPK: tl.constexpr, INTERP: tl.constexpr,
                      PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t = tl.program_id(0)
    ev = tl.arange(0, BLOCK_E)
    rmask = ev <= E
    acc = tl.zeros([BLOCK_E, BLOCK_K], tl.float32)
    for k0 in range(0, K_LOOP, BLOCK_K):
        w = dequant_tile(base_ptr, high_ptr, scale_ptr, ev, rmask, k0, K, KW_TOTAL, base_row, high_row,
                         scale_row, FMT, BLOCK_E, BLOCK_K, False, INTERP).to(tl.float32)
        kk = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_ptr + t * sx + kk, mask=kk < K, other=0.0).to(tl.float32)
        acc += w * xv[None, :]
    _route_token(tl.sum(acc, axis=1), ev, E, t, ids_ptr, w_ptr, gate_ptr, TOP_K, BLOCK_E, BLOCK_TOPK)


@triton.jit
def moe_router_split_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, logits_ptr, cnt_ptr, ids_ptr, w_ptr, gate_ptr,
                            T, E, K, KW_TOTAL, K_LOOP, base_row, high_row, scale_row, sx,
                            TOP_K: tl.constexpr, FMT: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_TOPK: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False):
    """Decode router over many programs: program i computes router rows [i*BLOCK_R, (i+1)*BLOCK_R)
    for all T tokens (each row read once per step) into the fp32 logits workspace [T, E+1]; the
    last program to arrive (an acq_rel ticket on a self-resetting counter) routes every token."""
    pdl_enter(PDL)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r <= E
    tv = tl.arange(0, BLOCK_T)
    tmask = tv < T
    acc = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
    for k0 in range(0, K_LOOP, BLOCK_K):
        w = dequant_tile(base_ptr, high_ptr, scale_ptr, r, rmask, k0, K, KW_TOTAL, base_row, high_row,
                         scale_row, FMT, BLOCK_R, BLOCK_K, False, INTERP).to(tl.float32)
        kk = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_ptr + tv[:, None] * sx + kk[None, :], mask=tmask[:, None] & (kk < K)[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(xv[:, None, :] * w[None, :, :], axis=2)
    tl.store(logits_ptr + tv[:, None] * (E + 1) + r[None, :], acc, mask=tmask[:, None] & rmask[None, :])
    fence_gpu(r, INTERP)  # this thread's logits are visible device-wide ...
    tl.debug_barrier()  # ... for every thread of the program, before the ticket is taken
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        fence_gpu(r, INTERP)
        ev = tl.arange(0, BLOCK_E)
        for t in range(0, T):
            logits = tl.load(logits_ptr + t * (E + 1) + ev, mask=ev <= E, other=0.0, cache_modifier=".cg")
            _route_token(logits, ev, E, t, ids_ptr, w_ptr, gate_ptr, TOP_K, BLOCK_E, BLOCK_TOPK)
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def moe_group_kernel(ids_ptr, offsets_ptr, tile_end_ptr, sorted_ptr, P, E,
                     BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
                     PDL: tl.constexpr = False):
    pdl_enter(PDL)
    ev = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], tl.int32)
    for c0 in range(0, P, CHUNK):
        p = c0 + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + p, mask=p < P, other=-1)
        counts += tl.sum((e[:, None] == ev[None, :]).to(tl.int32), axis=0)
    ends = tl.cumsum(counts, axis=0)
    starts = ends - counts
    tl.store(offsets_ptr + ev, starts, mask=ev == 0)
    tl.store(offsets_ptr + 1 + ev, ends, mask=ev < E)
    tl.store(tile_end_ptr + ev, tl.cumsum((counts + BLOCK_T - 1) // BLOCK_T, axis=0), mask=ev < E)
    seen = starts
    for c0 in range(0, P, CHUNK):
        p = c0 + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + p, mask=p < P, other=-1)
        hot = (e[:, None] == ev[None, :]).to(tl.int32)
        before = tl.cumsum(hot, axis=0) - hot          # earlier pairs of the chunk with the same expert
        pos = tl.sum(hot * (before + seen[None, :]), axis=1)
        tl.store(sorted_ptr + pos, p, mask=p < P)
        seen += tl.sum(hot, axis=0)


@triton.jit
def _tile(ids_ptr, tile_end_ptr, offsets_ptr, sorted_ptr, E, P, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
          GROUPED: tl.constexpr):
    """(active, expert, pairs [BLOCK_T], pair mask) of tile slot program_id(0). GROUPED: the tiles
    the grouping kernel wrote (one expert, up to BLOCK_T of its pairs); else tile g is pair g alone
    (BLOCK_T 1: no grouping launch; an expert two tokens chose is read twice)."""
    g = tl.program_id(0)
    if GROUPED:
        ev = tl.arange(0, BLOCK_E)
        ends = tl.load(tile_end_ptr + ev, mask=ev < E, other=2147483647)
        n_tiles = tl.load(tile_end_ptr + E - 1)
        e = tl.minimum(tl.sum((ends <= g).to(tl.int32), axis=0), E - 1)
        first_tile = tl.sum(tl.where(ev == e - 1, ends, 0), axis=0)
        j = tl.load(offsets_ptr + e) + (g - first_tile) * BLOCK_T + tl.arange(0, BLOCK_T)
        active = g < n_tiles
        pmask = j < tl.where(active, tl.load(offsets_ptr + e + 1), 0)
        pairs = tl.load(sorted_ptr + j, mask=pmask, other=0)
    else:
        pairs = g + tl.arange(0, BLOCK_T)
        active = g < P
        pmask = pairs < P
        e = tl.load(ids_ptr + g)
    return active, e, pairs, pmask


@triton.jit
def _n_tiles(tile_end_ptr, E, P, GROUPED: tl.constexpr):
    if GROUPED:
        n = tl.load(tile_end_ptr + E - 1)
    else:
        n = P
    return n


@triton.jit
def _product(acc, a, w, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr):
    """acc[BT, BN] += a[BT, BK] . w[BN, BK]^T (fp32 accumulation)."""
    if USE_DOT:
        if DOT_F32:
            acc += tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)))
        else:
            acc += tl.dot(a.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
    else:
        acc += tl.sum(a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return acc


@triton.jit
def moe_gate_up_kernel(x_ptr, ids_ptr, base_ptr, high_ptr, scale_ptr, act_ptr,
                       tile_end_ptr, offsets_ptr, sorted_ptr,
                       E, P, TOP_K, I, H, K_LOOP, KW_TOTAL, base_row, high_row, scale_row, sx,
                       FMT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, USE_DOT: tl.constexpr,
                       DOT_F32: tl.constexpr, GROUPED: tl.constexpr, INTERP: tl.constexpr,
                       PDL: tl.constexpr = False):
    pdl_enter(PDL)
    active, e, pairs, pmask = _tile(ids_ptr, tile_end_ptr, offsets_ptr, sorted_ptr, E, P, BLOCK_T, BLOCK_E, GROUPED)
    if active:
        tok = pairs // TOP_K
        r = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = r < I
        rows_g = e * (2 * I) + r
        acc_g = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
        for k0 in range(0, K_LOOP, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + tok[:, None] * sx + kk[None, :], mask=pmask[:, None] & (kk < H)[None, :],
                        other=0.0)
            wg = dequant_tile(base_ptr, high_ptr, scale_ptr, rows_g, rmask, k0, H, KW_TOTAL, base_row,
                              high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
            wu = dequant_tile(base_ptr, high_ptr, scale_ptr, rows_g + I, rmask, k0, H, KW_TOTAL, base_row,
                              high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
            acc_g = _product(acc_g, a, wg, USE_DOT, DOT_F32)
            acc_u = _product(acc_u, a, wu, USE_DOT, DOT_F32)
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(act_ptr + pairs[:, None] * I + r[None, :], act, mask=pmask[:, None] & rmask[None, :])


@triton.jit
def moe_down_kernel(act_ptr, ids_ptr, base_ptr, high_ptr, scale_ptr, y_ptr, tile_end_ptr, offsets_ptr, sorted_ptr,
                    w_ptr, shared_ptr, gate_ptr, res_ptr, out_ptr, cnt_ptr,
                    E, P, T, TOP_K, I, H, K_LOOP, KW_TOTAL, base_row, high_row, scale_row, s_shared, s_res, s_out,
                    FMT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, USE_DOT: tl.constexpr,
                    DOT_F32: tl.constexpr, GROUPED: tl.constexpr, FUSED_COMBINE: tl.constexpr,
                    BLOCK_TT: tl.constexpr, BLOCK_TOPK: tl.constexpr, INTERP: tl.constexpr,
                    PDL: tl.constexpr = False):
    """y[pair, h-block] of the tile's pairs. FUSED_COMBINE: then the last of the step's tiles to
    arrive at this h-block (acq_rel ticket on a self-resetting counter) writes out[:, h-block] for
    every token (the combine, summed in slot order like the combine launch)."""
    pdl_enter(PDL)
    active, e, pairs, pmask = _tile(ids_ptr, tile_end_ptr, offsets_ptr, sorted_ptr, E, P, BLOCK_T, BLOCK_E, GROUPED)
    if active:
        h = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        hmask = h < H
        rows = e * H + h
        acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
        for k0 in range(0, K_LOOP, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(act_ptr + pairs[:, None] * I + kk[None, :], mask=pmask[:, None] & (kk < I)[None, :],
                        other=0.0)
            w = dequant_tile(base_ptr, high_ptr, scale_ptr, rows, hmask, k0, I, KW_TOTAL, base_row,
                             high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
            acc = _product(acc, a, w, USE_DOT, DOT_F32)
        tl.store(y_ptr + pairs[:, None] * H + h[None, :], acc, mask=pmask[:, None] & hmask[None, :])
        if FUSED_COMBINE:
            fence_gpu(h, INTERP)  # this thread's y rows are visible device-wide ...
            tl.debug_barrier()  # ... for every thread of the program, before the ticket is taken
            ticket = tl.atomic_add(cnt_ptr + tl.program_id(1), 1, sem="acq_rel", scope="gpu")
            if ticket == _n_tiles(tile_end_ptr, E, P, GROUPED) - 1:
                fence_gpu(h, INTERP)
                t = tl.arange(0, BLOCK_TT)
                j = tl.arange(0, BLOCK_TOPK)
                tm = t < T
                m2 = tm[:, None] & hmask[None, :]
                acc2 = tl.load(res_ptr + t[:, None] * s_res + h[None, :], mask=m2, other=0.0).to(tl.float32)
                g = tl.load(gate_ptr + t, mask=tm, other=0.0)
                acc2 += g[:, None] * tl.load(shared_ptr + t[:, None] * s_shared + h[None, :], mask=m2,
                                             other=0.0).to(tl.float32)
                pr = t[:, None] * TOP_K + j[None, :]  # [TT, TOPK] pair ids
                pm = tm[:, None] & (j < TOP_K)[None, :]
                wj = tl.load(w_ptr + pr, mask=pm, other=0.0)
                yv = tl.load(y_ptr + pr[:, :, None] * H + h[None, None, :], mask=pm[:, :, None] & hmask[None, None, :],
                             other=0.0, cache_modifier=".cg")
                for jj in tl.static_range(BLOCK_TOPK):  # slot order, as the combine launch sums
                    sel = (j == jj)[None, :, None]
                    acc2 += tl.sum(tl.where(sel, wj[:, :, None] * yv, 0.0), axis=1)
                tl.store(out_ptr + t[:, None] * s_out + h[None, :], acc2, mask=m2)
                tl.atomic_xchg(cnt_ptr + tl.program_id(1), 0, sem="relaxed", scope="gpu")


@triton.jit
def moe_combine_kernel(y_ptr, w_ptr, shared_ptr, gate_ptr, res_ptr, out_ptr, TOP_K, H,
                       s_shared, s_res, s_out, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = h < H
    acc = tl.load(res_ptr + t * s_res + h, mask=m, other=0.0).to(tl.float32)
    acc += tl.load(gate_ptr + t) * tl.load(shared_ptr + t * s_shared + h, mask=m, other=0.0).to(tl.float32)
    for j in range(0, TOP_K):
        p = t * TOP_K + j
        acc += tl.load(w_ptr + p) * tl.load(y_ptr + p * H + h, mask=m, other=0.0)
    tl.store(out_ptr + t * s_out + h, acc, mask=m)
