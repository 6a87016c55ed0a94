"""Triton kernels of the MoE families.

Router (`moe_router_split_kernel`, one launch): a grid of (row blocks of the E + 1 rows: the
router rows and the shared-expert gate row, any linear weight format through the linear family's
`dequant_tile`) x (16-token blocks); each program reads its rows once for its tokens, and the last
row block to arrive at a token block routes those tokens. Routing (`_route_tokens`): softmax over the E router logits, top-k by k rounds of arg-max
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
def _route_tokens(logits, ev, t, tmask, E, ids_ptr, w_ptr, gate_ptr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_TOPK: tl.constexpr):
    """Tokens t [BT] from their E + 1 logits [BT, BLOCK_E], all at once (one reduction per round for
    every token): softmax over rows 0..E-1, top-k by k arg-max rounds (ties to the lower id),
    renormalised weights; sigmoid of row E (the shared gate)."""
    gate = tl.sum(tl.where(ev[None, :] == E, logits, 0.0), axis=1)
    lg = tl.where(ev[None, :] < E, logits, float("-inf"))
    p = tl.exp(lg - tl.max(lg, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    kv = tl.arange(0, BLOCK_TOPK)
    sel_ids = tl.zeros([logits.shape[0], BLOCK_TOPK], tl.int32)
    sel_w = tl.zeros([logits.shape[0], BLOCK_TOPK], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=1)
        idx = tl.min(tl.where(p == best[:, None], ev[None, :], BLOCK_E), axis=1)
        sel_ids = tl.where(kv[None, :] == j, idx[:, None], sel_ids)
        sel_w = tl.where(kv[None, :] == j, best[:, None], sel_w)
        p = tl.where(ev[None, :] == idx[:, None], -1.0, p)
    sel_w = sel_w / tl.sum(sel_w, axis=1)[:, None]
    kmask = tmask[:, None] & (kv < TOP_K)[None, :]
    tl.store(ids_ptr + t[:, None] * TOP_K + kv[None, :], sel_ids, mask=kmask)
    tl.store(w_ptr + t[:, None] * TOP_K + kv[None, :], sel_w, mask=kmask)
    tl.store(gate_ptr + t, 1.0 / (1.0 + tl.exp(-gate)), mask=tmask)


@triton.jit
def moe_router_split_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, logits_ptr, cnt_ptr, ids_ptr, w_ptr, gate_ptr,
                            T, E, K, KW_TOTAL, K_LOOP, base_row, high_row, scale_row, sx,
                            TOP_K: tl.constexpr, FMT: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_TOPK: tl.constexpr, DOT_F32: tl.constexpr, INTERP: tl.constexpr,
                            PDL: tl.constexpr = False):
    """The router over a (row block, token block) grid: program (i, b) computes router rows
    [i*BLOCK_R, (i+1)*BLOCK_R) for tokens [b*BLOCK_T, (b+1)*BLOCK_T) (each row read once per token
    block) into the fp32 logits workspace [T, E+1]; the last row block to arrive at token block b
    (an acq_rel ticket on its self-resetting counter b) routes those tokens. BLOCK_T 1 (T = 1): a
    GEMV ([BLOCK_R, BLOCK_K] products reduced once); else tl.dot on x [BLOCK_T, BLOCK_K]."""
    pdl_enter(PDL)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r <= E
    tv = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tv < T
    if BLOCK_T == 1:
        acc2 = tl.zeros([BLOCK_R, BLOCK_K], tl.float32)
        for k0 in range(0, K_LOOP, BLOCK_K):
            w = dequant_tile(base_ptr, high_ptr, scale_ptr, r, rmask, k0, K, KW_TOTAL, base_row, high_row,
                             scale_row, FMT, BLOCK_R, BLOCK_K, False, INTERP).to(tl.float32)
            kk = k0 + tl.arange(0, BLOCK_K)
            acc2 += w * tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)[None, :]
        acc = tl.sum(acc2, axis=1)[None, :]
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
        for k0 in range(0, K_LOOP, BLOCK_K):
            w = dequant_tile(base_ptr, high_ptr, scale_ptr, r, rmask, k0, K, KW_TOTAL, base_row, high_row,
                             scale_row, FMT, BLOCK_R, BLOCK_K, False, INTERP)
            kk = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + tv[:, None] * sx + kk[None, :], mask=tmask[:, None] & (kk < K)[None, :], other=0.0)
            acc = _product(acc, xv, w, True, DOT_F32)
    tl.store(logits_ptr + tv[:, None] * (E + 1) + r[None, :], acc, mask=tmask[:, None] & rmask[None, :])
    fence_gpu(r, INTERP)  # this thread's logits are visible device-wide ...
    tl.debug_barrier()  # ... for every thread of the program, before the ticket is taken
    ticket = tl.atomic_add(cnt_ptr + tl.program_id(1), 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        fence_gpu(r, INTERP)
        ev = tl.arange(0, BLOCK_E)
        lg = tl.load(logits_ptr + tv[:, None] * (E + 1) + ev[None, :], mask=tmask[:, None] & (ev <= E)[None, :],
                     other=0.0, cache_modifier=".cg")
        _route_tokens(lg, ev, tv, tmask, E, ids_ptr, w_ptr, gate_ptr, TOP_K, BLOCK_E, BLOCK_TOPK)
        tl.atomic_xchg(cnt_ptr + tl.program_id(1), 0, sem="relaxed", scope="gpu")


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
def _tile(tile_end_ptr, offsets_ptr, sorted_ptr, E, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """(active, expert, pairs [BLOCK_T], pair mask) of tile slot program_id(0): the tiles the
    grouping kernel wrote (one expert, up to BLOCK_T of its pairs)."""
    g = tl.program_id(0)
    ev = tl.arange(0, BLOCK_E)
    ends = tl.load(tile_end_ptr + ev, mask=ev < E, other=2147483647)
    n_tiles = tl.load(tile_end_ptr + E - 1)
    e = tl.minimum(tl.sum((ends <= g).to(tl.int32), axis=0), E - 1)
    first_tile = tl.sum(tl.where(ev == e - 1, ends, 0), axis=0)
    j = tl.load(offsets_ptr + e) + (g - first_tile) * BLOCK_T + tl.arange(0, BLOCK_T)
    active = g < n_tiles
    pmask = j < tl.where(active, tl.load(offsets_ptr + e + 1), 0)
    pairs = tl.load(sorted_ptr + j, mask=pmask, other=0)
    return active, e, pairs, pmask


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
    """act[pair, I-block] = SiLU(gate rows . x) * (up rows . x) of the tile's pairs. Ungrouped (one
    pair per program row): a GEMV, [BLOCK_N, BLOCK_K] products accumulated and reduced once."""
    pdl_enter(PDL)
    r = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = r < I
    if GROUPED:
        active, e, pairs, pmask = _tile(tile_end_ptr, offsets_ptr, sorted_ptr, E, BLOCK_T, BLOCK_E)
        if active:
            tok = pairs // TOP_K
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
    else:
        g = tl.program_id(0)
        rows_g = tl.load(ids_ptr + g) * (2 * I) + r
        tok = g // TOP_K
        acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K_LOOP, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + tok * sx + kk, mask=kk < H, other=0.0).to(tl.float32)
            wg = dequant_tile(base_ptr, high_ptr, scale_ptr, rows_g, rmask, k0, H, KW_TOTAL, base_row,
                              high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
            wu = dequant_tile(base_ptr, high_ptr, scale_ptr, rows_g + I, rmask, k0, H, KW_TOTAL, base_row,
                              high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
            acc_g += wg.to(tl.float32) * a[None, :]
            acc_u += wu.to(tl.float32) * a[None, :]
        gs = tl.sum(acc_g, axis=1)
        act = gs / (1.0 + tl.exp(-gs)) * tl.sum(acc_u, axis=1)
        tl.store(act_ptr + g * I + r, act, mask=rmask)


@triton.jit
def _fused_combine(y_ptr, w_ptr, shared_ptr, gate_ptr, res_ptr, out_ptr, cnt_ptr, h, hmask, n_tiles, T, TOP_K, H,
                   s_shared, s_res, s_out, BLOCK_TT: tl.constexpr, BLOCK_TOPK: tl.constexpr,
                   INTERP: tl.constexpr):
    """After this program stored y[:, h-block]: the last of the step's n_tiles tiles to arrive at
    this h-block (acq_rel ticket on a self-resetting counter) writes out[:, h-block] for every
    token, the slots summed in slot order like the combine launch."""
    fence_gpu(h, INTERP)  # this thread's y rows are visible device-wide ...
    tl.debug_barrier()  # ... for every thread of the program, before the ticket is taken
    ticket = tl.atomic_add(cnt_ptr + tl.program_id(1), 1, sem="acq_rel", scope="gpu")
    if ticket == n_tiles - 1:
        fence_gpu(h, INTERP)
        t = tl.arange(0, BLOCK_TT)
        j = tl.arange(0, BLOCK_TOPK)
        tm = t < T
        m2 = tm[:, None] & hmask[None, :]
        acc = tl.load(res_ptr + t[:, None] * s_res + h[None, :], mask=m2, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + t, mask=tm, other=0.0)
        acc += g[:, None] * tl.load(shared_ptr + t[:, None] * s_shared + h[None, :], mask=m2, other=0.0).to(tl.float32)
        pr = t[:, None] * TOP_K + j[None, :]  # [TT, TOPK] pair ids
        pm = tm[:, None] & (j < TOP_K)[None, :]
        wj = tl.load(w_ptr + pr, mask=pm, other=0.0)
        yv = tl.load(y_ptr + pr[:, :, None] * H + h[None, None, :], mask=pm[:, :, None] & hmask[None, None, :],
                     other=0.0, cache_modifier=".cg")
        for jj in tl.static_range(BLOCK_TOPK):  # slot order
            acc += tl.sum(tl.where((j == jj)[None, :, None], wj[:, :, None] * yv, 0.0), axis=1)
        tl.store(out_ptr + t[:, None] * s_out + h[None, :], acc, mask=m2)
        tl.atomic_xchg(cnt_ptr + tl.program_id(1), 0, sem="relaxed", scope="gpu")


@triton.jit
def moe_down_kernel(act_ptr, ids_ptr, base_ptr, high_ptr, scale_ptr, y_ptr, tile_end_ptr, offsets_ptr, sorted_ptr,
                    w_ptr, shared_ptr, gate_ptr, res_ptr, out_ptr, cnt_ptr,
                    E, P, T, TOP_K, I, H, K_LOOP, KW_TOTAL, base_row, high_row, scale_row, s_shared, s_res, s_out,
                    FMT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, USE_DOT: tl.constexpr,
                    DOT_F32: tl.constexpr, GROUPED: tl.constexpr, FUSED_COMBINE: tl.constexpr,
                    BLOCK_TT: tl.constexpr, BLOCK_TOPK: tl.constexpr, INTERP: tl.constexpr,
                    PDL: tl.constexpr = False):
    """y[pair, h-block] of the tile's pairs (ungrouped: a GEMV per pair, as in gate/up), then with
    FUSED_COMBINE the step's combine for this h-block by its last arrival (`_fused_combine`)."""
    pdl_enter(PDL)
    h = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    hmask = h < H
    if GROUPED:
        active, e, pairs, pmask = _tile(tile_end_ptr, offsets_ptr, sorted_ptr, E, BLOCK_T, BLOCK_E)
        if active:
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
                _fused_combine(y_ptr, w_ptr, shared_ptr, gate_ptr, res_ptr, out_ptr, cnt_ptr, h, hmask,
                               tl.load(tile_end_ptr + E - 1), T, TOP_K, H, s_shared, s_res, s_out, BLOCK_TT,
                               BLOCK_TOPK, INTERP)
    else:
        g = tl.program_id(0)
        rows = tl.load(ids_ptr + g) * H + h
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K_LOOP, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(act_ptr + g * I + kk, mask=kk < I, other=0.0)
            w = dequant_tile(base_ptr, high_ptr, scale_ptr, rows, hmask, k0, I, KW_TOTAL, base_row,
                             high_row, scale_row, FMT, BLOCK_N, BLOCK_K, False, INTERP)
            acc2 += w.to(tl.float32) * a[None, :]
        tl.store(y_ptr + g * H + h, tl.sum(acc2, axis=1), mask=hmask)
        if FUSED_COMBINE:
            _fused_combine(y_ptr, w_ptr, shared_ptr, gate_ptr, res_ptr, out_ptr, cnt_ptr, h, hmask, P, T, TOP_K, H,
                           s_shared, s_res, s_out, BLOCK_TT, BLOCK_TOPK, INTERP)


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
