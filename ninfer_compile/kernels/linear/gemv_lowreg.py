"""Low-register decode GEMV (T <= 4) for the row-split Q4 / Q5 / Q6 planes: routes
`q4_gemv_lowreg`, `q5_gemv_lowreg`, `q6_gemv_lowreg` (registered in `routes.py`; the PTX text in `ptx.py`).

Work unit = one 16-byte chunk (4 words = 32 lanes = half a G64 group) of one row. The weight tile
is [BLOCK_N, KC] chunks (KC = BLOCK_K / 32); every thread owns whole chunks, so
- weights are read by one 16-byte load per chunk (`ld.global.nc.L1::no_allocate.v4`);
- the chunk's activations for every column t < T are 4 x 16-byte loads per column, kept as 16
  packed bf16x2 registers per column and shared by every row the thread holds;
- one asm instance per (row, chunk) dequantizes the 4 words with prmt / lop3 (magic-number bf16x2,
  no I2F) and returns, per column, the chunk's unscaled dot product in fp32;
- the group scale is applied once per chunk and column (`acc_t += o_t * s`), into a [BLOCK_N, KC]
  fp32 accumulator: one register per (row, column) per thread (the q4_gemv asm path keeps
  [BLOCK_N, KW] = 4x more, and broadcasts x per word).
KC is reduced once after the loop; split-K / epilogues reuse `epilogue.py`.

Q5 / Q6 high bits are merged into the nibble bytes before the prmt (so the per-pair lop3 is the
same single instruction as for Q4, with a 5- / 6-bit mask and the bit-(b-1) flip that makes the
code offset binary):
- Q5 (one high word per chunk, byte j = the 8 high bits of word j): Y_j = byte j of H spread so
  that byte p bits 4,5 = high bits of lanes 2p, 2p+1 (two prmt of H<<4 / H<<2 and H / H>>2 + one
  select); A = select(w, Y, 0x10101010), B = select(w >> 4, Y >> 1, 0x10101010).
- Q6 (two high words per chunk, 16 bits per word, 2 per lane): X_j = prmt(H<<4, H) puts lane
  pair p's 4 bits at bits 4..7 of byte p; A = select(w, X, 0x30303030),
  B = select(w >> 4, X >> 2, 0x30303030).
Then pair p = prmt(A, B) (lane 2p in half 0, lane 2p+1 in half 1), (pair & mask) ^ magic = bf16x2
(128 + 2^(b-1) + q), one fma.rn.bf16x2 subtracts the bias exactly, and CHAIN words of products
are accumulated in bf16x2 (4 * CHAIN products per half) before widening to fp32.

USE_ASM=False (and always under the Triton interpreter) runs a plain-Triton fp32 equivalent with
the same tiling, chunk scales and accumulator shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import RouteError
from .dequant import magic_f32
from .epilogue import EPI_CODES, FIXUP_COUNTERS, fixup_counters, splitk_fixup
from .gemv import _finish
from .launch import (_FMT_CODE, asm_supported, check_call, interpreting, named_launcher,
                     reduce_split_k, splitk_workspace)
from .ptx import LD_W, LD_W_L2, LD_X, chunk_asm_source, chunk_constraints
from .routes import linear_workspace_numel  # noqa: F401  (the family's sizing hook, on each launcher module)
from .weights import QuantWeight
from ..pdl import pdl_enter
from ..pdl import pdl_launch

# (fmt, BLOCK_T, CHAIN) -> asm text / constraints, as constexprs chosen inside the kernel
_A = {(f, t, c): tl.constexpr(chunk_asm_source(f, t, c)) for f in (4, 5, 6) for t in (1, 2, 4) for c in (1, 2, 4)}
_C = {(f, t): tl.constexpr(chunk_constraints(f, t)) for f in (4, 5, 6) for t in (1, 2, 4)}
# a few names the jit can reference as globals
for (_f, _t, _c), _v in _A.items():
    globals()[f"ASM_{_f}_{_t}_{_c}"] = _v
for (_f, _t), _v in _C.items():
    globals()[f"CON_{_f}_{_t}"] = _v

W_LD_ASM = tl.constexpr(LD_W)
W_LD_L2_ASM = tl.constexpr(LD_W_L2)   # + an L2::256B prefetch hint
X_LD_ASM = tl.constexpr(LD_X)


@triton.jit
def _ld4(addr, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,l", [addr.to(tl.int64, bitcast=True)],
                                     dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _xcol(x_ptr, t, sx, cg, K, T, shape):
    """Column t's 16 bf16x2 pairs of every chunk (4 x 16-byte loads), broadcast to `shape`.
    Columns >= T read column 0; words past K read the row's last word (finite; their codes are 0)."""
    row = x_ptr + tl.where(t < T, t, 0) * sx
    kw_last = K // 8 - 1
    a0, a1, a2, a3 = _ld4(row + tl.minimum(cg * 4 + 0, kw_last) * 8, X_LD_ASM)
    b0, b1, b2, b3 = _ld4(row + tl.minimum(cg * 4 + 1, kw_last) * 8, X_LD_ASM)
    c0, c1, c2, c3 = _ld4(row + tl.minimum(cg * 4 + 2, kw_last) * 8, X_LD_ASM)
    d0, d1, d2, d3 = _ld4(row + tl.minimum(cg * 4 + 3, kw_last) * 8, X_LD_ASM)
    return (tl.broadcast_to(a0[None, :], shape), tl.broadcast_to(a1[None, :], shape),
            tl.broadcast_to(a2[None, :], shape), tl.broadcast_to(a3[None, :], shape),
            tl.broadcast_to(b0[None, :], shape), tl.broadcast_to(b1[None, :], shape),
            tl.broadcast_to(b2[None, :], shape), tl.broadcast_to(b3[None, :], shape),
            tl.broadcast_to(c0[None, :], shape), tl.broadcast_to(c1[None, :], shape),
            tl.broadcast_to(c2[None, :], shape), tl.broadcast_to(c3[None, :], shape),
            tl.broadcast_to(d0[None, :], shape), tl.broadcast_to(d1[None, :], shape),
            tl.broadcast_to(d2[None, :], shape), tl.broadcast_to(d3[None, :], shape))


@triton.jit
def _chunk_asm(w0, w1, w2, w3, h0, h1, xa, xb, xc, xd, FMT: tl.constexpr, BLOCK_T: tl.constexpr,
               CHAIN: tl.constexpr):
    """Unscaled fp32 chunk dot products for BLOCK_T (1, 2, 4) columns (xa..xd: 16-tuples)."""
    if FMT == 4:
        hw = ()
    elif FMT == 5:
        hw = (h0,)
    else:
        hw = (h0, h1)
    if BLOCK_T == 1:
        if FMT == 4:
            if CHAIN == 1:
                r = tl.inline_asm_elementwise(ASM_4_1_1, CON_4_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
            elif CHAIN == 2:
                r = tl.inline_asm_elementwise(ASM_4_1_2, CON_4_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
            else:
                r = tl.inline_asm_elementwise(ASM_4_1_4, CON_4_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
        elif FMT == 5:
            if CHAIN == 1:
                r = tl.inline_asm_elementwise(ASM_5_1_1, CON_5_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
            elif CHAIN == 2:
                r = tl.inline_asm_elementwise(ASM_5_1_2, CON_5_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
            else:
                r = tl.inline_asm_elementwise(ASM_5_1_4, CON_5_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
        else:
            if CHAIN == 1:
                r = tl.inline_asm_elementwise(ASM_6_1_1, CON_6_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
            elif CHAIN == 2:
                r = tl.inline_asm_elementwise(ASM_6_1_2, CON_6_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
            else:
                r = tl.inline_asm_elementwise(ASM_6_1_4, CON_6_1, (w0, w1, w2, w3) + hw + xa, dtype=tl.float32, is_pure=True, pack=1)
        o0 = r
        o1 = r
        o2 = r
        o3 = r
    elif BLOCK_T == 2:
        args = (w0, w1, w2, w3) + hw + xa + xb
        if FMT == 4:
            if CHAIN == 1:
                o0, o1 = tl.inline_asm_elementwise(ASM_4_2_1, CON_4_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            elif CHAIN == 2:
                o0, o1 = tl.inline_asm_elementwise(ASM_4_2_2, CON_4_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                o0, o1 = tl.inline_asm_elementwise(ASM_4_2_4, CON_4_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        elif FMT == 5:
            if CHAIN == 1:
                o0, o1 = tl.inline_asm_elementwise(ASM_5_2_1, CON_5_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            elif CHAIN == 2:
                o0, o1 = tl.inline_asm_elementwise(ASM_5_2_2, CON_5_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                o0, o1 = tl.inline_asm_elementwise(ASM_5_2_4, CON_5_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            if CHAIN == 1:
                o0, o1 = tl.inline_asm_elementwise(ASM_6_2_1, CON_6_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            elif CHAIN == 2:
                o0, o1 = tl.inline_asm_elementwise(ASM_6_2_2, CON_6_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                o0, o1 = tl.inline_asm_elementwise(ASM_6_2_4, CON_6_2, args, dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        o2 = o0
        o3 = o0
    else:
        args = (w0, w1, w2, w3) + hw + xa + xb + xc + xd
        if FMT == 4:
            if CHAIN == 1:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_4_4_1, CON_4_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
            elif CHAIN == 2:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_4_4_2, CON_4_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_4_4_4, CON_4_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        elif FMT == 5:
            if CHAIN == 1:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_5_4_1, CON_5_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
            elif CHAIN == 2:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_5_4_2, CON_5_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_5_4_4, CON_5_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            if CHAIN == 1:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_6_4_1, CON_6_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
            elif CHAIN == 2:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_6_4_2, CON_6_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                o0, o1, o2, o3 = tl.inline_asm_elementwise(ASM_6_4_4, CON_6_4, args, dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    return o0, o1, o2, o3


@triton.jit
def _highs_and_scale(high_ptr, scale_ptr, rows_c, rmask, cg, cg_c, KC_TOTAL, high_row, scale_row, w0,
                     FMT: tl.constexpr):
    """A chunk tile's high words (Q5: 1, Q6: 2; else copies of w0, unused) and fp32 scale (0 for chunks
    past the row: their products vanish), at the clamped chunk indices cg_c."""
    m = rmask[:, None] & (cg < KC_TOTAL)[None, :]
    s = tl.load(scale_ptr + rows_c[:, None] * scale_row + (cg_c // 2)[None, :], mask=m, other=0.0).to(tl.float32)
    if FMT == 5:
        h0 = tl.load(high_ptr + rows_c[:, None] * high_row + cg_c[None, :])
        h1 = h0
    elif FMT == 6:
        hp = high_ptr + rows_c[:, None] * high_row + (cg_c * 2)[None, :]
        h0 = tl.load(hp)
        h1 = tl.load(hp + 1)
    else:
        h0 = w0
        h1 = w0
    return h0, h1, s


@triton.jit
def _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c, rmask, cg, KC_TOTAL, base_row, high_row, scale_row,
                 FMT: tl.constexpr, CLAMP=None, L2_HINT: tl.constexpr = False):
    """One [BLOCK_N, KC] tile of chunks: the 4 base words, the high words (Q5: 1, Q6: 2; else
    copies of w0, unused) and the fp32 chunk scale (0 for chunks past the row). Chunk indices are
    clamped to CLAMP - 1 (default: the row's last chunk) so every address is in bounds; chunks past
    the row get scale 0 and their products vanish."""
    if CLAMP is None:
        cg_c = tl.minimum(cg, KC_TOTAL - 1)
    else:
        cg_c = tl.minimum(cg, CLAMP - 1)
    if L2_HINT:
        w0, w1, w2, w3 = _ld4(base_ptr + rows_c[:, None] * base_row + (cg_c * 4)[None, :], W_LD_L2_ASM)
    else:
        w0, w1, w2, w3 = _ld4(base_ptr + rows_c[:, None] * base_row + (cg_c * 4)[None, :], W_LD_ASM)
    h0, h1, s = _highs_and_scale(high_ptr, scale_ptr, rows_c, rmask, cg, cg_c, KC_TOTAL, high_row, scale_row, w0,
                                 FMT)
    return w0, w1, w2, w3, h0, h1, s


@triton.jit
def _load_chunks_async(base_ptr, high_ptr, scale_ptr, rows_c, rmask, cg, KC_TOTAL, base_row, high_row, scale_row,
                       FMT: tl.constexpr, BLOCK_N: tl.constexpr, KC: tl.constexpr):
    """`_load_chunks` with plain loads (ASYNC): the base words come as one [BLOCK_N, KC, 4] load that
    Triton's pipeliner turns into cp.async copies into a shared-memory ring (`tl.range(num_stages=..)` in
    the caller), so the bytes in flight hold no registers; then split into the 4 word tensors."""
    cg_c = tl.minimum(cg, KC_TOTAL - 1)
    j = tl.arange(0, 4)
    words = tl.load(base_ptr + rows_c[:, None, None] * base_row + (cg_c * 4)[None, :, None] + j[None, None, :])
    even, odd = tl.split(tl.reshape(words, [BLOCK_N, KC, 2, 2]))  # word 2i + l: l = 0 / 1
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    h0, h1, s = _highs_and_scale(high_ptr, scale_ptr, rows_c, rmask, cg, cg_c, KC_TOTAL, high_row, scale_row, w0,
                                 FMT)
    return w0, w1, w2, w3, h0, h1, s


@triton.jit
def _dot_chunks(acc0, acc1, acc2, acc3, w0, w1, w2, w3, h0, h1, s, xa, xb, xc, xd, FMT: tl.constexpr,
                BLOCK_T: tl.constexpr, CHAIN: tl.constexpr):
    o0, o1, o2, o3 = _chunk_asm(w0, w1, w2, w3, h0, h1, xa, xb, xc, xd, FMT, BLOCK_T, CHAIN)
    acc0 += o0 * s
    if BLOCK_T > 1:
        acc1 += o1 * s
    if BLOCK_T > 2:
        acc2 += o2 * s
        acc3 += o3 * s
    return acc0, acc1, acc2, acc3


@triton.jit
def _x_chunks(x_ptr, cg, KC_TOTAL, K, T, sx, shape: tl.constexpr, BLOCK_T: tl.constexpr):
    cg_c = tl.minimum(cg, KC_TOTAL - 1)
    xa = _xcol(x_ptr, 0, sx, cg_c, K, T, shape)
    xb = xa
    xc = xa
    xd = xa
    if BLOCK_T > 1:
        xb = _xcol(x_ptr, 1, sx, cg_c, K, T, shape)
    if BLOCK_T > 2:
        xc = _xcol(x_ptr, 2, sx, cg_c, K, T, shape)
        xd = _xcol(x_ptr, 3, sx, cg_c, K, T, shape)
    return xa, xb, xc, xd


# ---------------------------------------------------------------------------------------------
# plain-Triton path (interpreter / USE_ASM=False): same tiling, fp32 lanes and FMAs
# ---------------------------------------------------------------------------------------------
@triton.jit
def _xdot(q, x_ptr, t, sx, cg, K, T):
    """sum over the chunk's 32 lanes of q[BN, KC, 32] * x[t, 32 cg + l] -> [BN, KC]"""
    l = tl.arange(0, 32)
    kk = cg[:, None] * 32 + l[None, :]
    xv = tl.load(x_ptr + t * sx + kk, mask=(kk < K) & ((kk * 0 + t) < T), other=0.0).to(tl.float32)
    return tl.sum(q * xv[None, :, :], axis=2)


@triton.jit
def _rows_plain(acc0, acc1, acc2, acc3, x_ptr, base_ptr, high_ptr, scale_ptr, rows, rmask, cg, cmask,
                base_row, high_row, scale_row, K, T, sx, FMT: tl.constexpr, BLOCK_T: tl.constexpr):
    """Same chunk tiling as the asm path; the chunk's 32 lanes are a third (in-thread) axis."""
    m = rmask[:, None] & cmask[None, :]
    s = tl.load(scale_ptr + rows[:, None] * scale_row + (cg // 2)[None, :], mask=m, other=0.0).to(tl.float32)
    l = tl.arange(0, 32)
    m3 = m[:, :, None]
    w = tl.load(base_ptr + rows[:, None, None] * base_row + (cg * 4)[None, :, None] + (l // 8)[None, None, :],
                mask=m3, other=0)
    u = (w >> (4 * (l % 8))[None, None, :]) & 0xF
    if FMT == 5:
        h = tl.load(high_ptr + rows[:, None] * high_row + cg[None, :], mask=m, other=0)
        u = u | (((h[:, :, None] >> l[None, None, :]) & 1) << 4)
    if FMT == 6:
        h = tl.load(high_ptr + rows[:, None, None] * high_row + (cg * 2)[None, :, None] + (l // 16)[None, None, :],
                    mask=m3, other=0)
        u = u | (((h >> (2 * (l % 16))[None, None, :]) & 3) << 4)
    OFF: tl.constexpr = 8 if FMT == 4 else (16 if FMT == 5 else 32)
    q = magic_f32(u ^ OFF, OFF)
    acc0 += _xdot(q, x_ptr, 0, sx, cg, K, T) * s
    if BLOCK_T > 1:
        acc1 += _xdot(q, x_ptr, 1, sx, cg, K, T) * s
    if BLOCK_T > 2:
        acc2 += _xdot(q, x_ptr, 2, sx, cg, K, T) * s
        acc3 += _xdot(q, x_ptr, 3, sx, cg, K, T) * s
    return acc0, acc1, acc2, acc3


@triton.jit
def gemv_lowreg_kernel(x_ptr, base_ptr, high_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr, cnt_ptr,
                       T, K, N_OUT, KC_TOTAL, base_row, high_row, scale_row, up_off,
                       sx, so, sr, iters_per_split,
                       FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT_K: tl.constexpr,
                       CHAIN: tl.constexpr = 1, INTERP: tl.constexpr = False,
                       USE_ASM: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                       L2_HINT: tl.constexpr = False, FUSED_REDUCE: tl.constexpr = False,
                       ASYNC: tl.constexpr = 0, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    tl.static_assert(BLOCK_T <= 4)
    KC: tl.constexpr = BLOCK_K // 32
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N_OUT
    rows_c = tl.minimum(rows, N_OUT - 1)
    zero = tl.zeros([BLOCK_N, KC], tl.float32)
    a0 = zero
    a1 = zero
    a2 = zero
    a3 = zero
    u0 = zero
    u1 = zero
    u2 = zero
    u3 = zero
    n_iters = tl.cdiv(KC_TOTAL, KC)
    it0 = pid_k * iters_per_split
    it1 = tl.minimum(it0 + iters_per_split, n_iters)
    shape: tl.constexpr = (BLOCK_N, KC)
    kc = tl.arange(0, KC)
    if USE_ASM and ASYNC > 0:
        # the weight chunks (and scales / high words) through an ASYNC-stage cp.async ring in shared
        # memory (Triton's pipeliner, which inline-asm loads would bypass): more bytes in flight per SM
        # than a register double buffer can hold (Nsight: the asm-load routes wait on their loads)
        for it in tl.range(it0, it1, num_stages=ASYNC):
            cg = it * KC + kc
            xa, xb, xc, xd = _x_chunks(x_ptr, cg, KC_TOTAL, K, T, sx, shape, BLOCK_T)
            gw0, gw1, gw2, gw3, gh0, gh1, gs = _load_chunks_async(base_ptr, high_ptr, scale_ptr, rows_c, rmask,
                                                                  cg, KC_TOTAL, base_row, high_row, scale_row,
                                                                  FMT, BLOCK_N, KC)
            a0, a1, a2, a3 = _dot_chunks(a0, a1, a2, a3, gw0, gw1, gw2, gw3, gh0, gh1, gs, xa, xb, xc, xd,
                                         FMT, BLOCK_T, CHAIN)
            if EPI == 1:
                uw0, uw1, uw2, uw3, uh0, uh1, us = _load_chunks_async(base_ptr, high_ptr, scale_ptr,
                                                                      rows_c + up_off, rmask, cg, KC_TOTAL,
                                                                      base_row, high_row, scale_row, FMT,
                                                                      BLOCK_N, KC)
                u0, u1, u2, u3 = _dot_chunks(u0, u1, u2, u3, uw0, uw1, uw2, uw3, uh0, uh1, us, xa, xb, xc,
                                             xd, FMT, BLOCK_T, CHAIN)
    elif USE_ASM and PREFETCH:
        # register double buffer: the next step's weight chunks are loaded before this step's
        # dequant + dot, so every warp keeps a step of loads in flight while it computes (inline-asm
        # loads are invisible to Triton's software pipeliner). The load after the last step is
        # clamped to the last chunk (an L2 hit, no extra HBM traffic).
        gw0, gw1, gw2, gw3, gh0, gh1, gs = _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c, rmask,
                                                        it0 * KC + kc, KC_TOTAL, base_row, high_row,
                                                        scale_row, FMT, None, L2_HINT)
        uw0, uw1, uw2, uw3, uh0, uh1, us = gw0, gw1, gw2, gw3, gh0, gh1, gs
        if EPI == 1:
            uw0, uw1, uw2, uw3, uh0, uh1, us = _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c + up_off,
                                                            rmask, it0 * KC + kc, KC_TOTAL, base_row,
                                                            high_row, scale_row, FMT, None, L2_HINT)
        # the prefetch after this program's last step re-reads its own last chunks (an L1/L2 hit),
        # never the next split's first ones
        lim = tl.minimum(it1 * KC, KC_TOTAL)
        for it in range(it0, it1):
            cg = it * KC + kc
            nw0, nw1, nw2, nw3, nh0, nh1, ns = _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c, rmask,
                                                            cg + KC, KC_TOTAL, base_row, high_row,
                                                            scale_row, FMT, lim, L2_HINT)
            vw0, vw1, vw2, vw3, vh0, vh1, vs = nw0, nw1, nw2, nw3, nh0, nh1, ns
            if EPI == 1:
                vw0, vw1, vw2, vw3, vh0, vh1, vs = _load_chunks(base_ptr, high_ptr, scale_ptr,
                                                                rows_c + up_off, rmask, cg + KC, KC_TOTAL,
                                                                base_row, high_row, scale_row, FMT, lim, L2_HINT)
            xa, xb, xc, xd = _x_chunks(x_ptr, cg, KC_TOTAL, K, T, sx, shape, BLOCK_T)
            a0, a1, a2, a3 = _dot_chunks(a0, a1, a2, a3, gw0, gw1, gw2, gw3, gh0, gh1, gs, xa, xb, xc, xd,
                                         FMT, BLOCK_T, CHAIN)
            if EPI == 1:
                u0, u1, u2, u3 = _dot_chunks(u0, u1, u2, u3, uw0, uw1, uw2, uw3, uh0, uh1, us, xa, xb, xc,
                                             xd, FMT, BLOCK_T, CHAIN)
            gw0, gw1, gw2, gw3, gh0, gh1, gs = nw0, nw1, nw2, nw3, nh0, nh1, ns
            uw0, uw1, uw2, uw3, uh0, uh1, us = vw0, vw1, vw2, vw3, vh0, vh1, vs
    else:
        for it in range(it0, it1):
            cg = it * KC + kc
            if USE_ASM:
                xa, xb, xc, xd = _x_chunks(x_ptr, cg, KC_TOTAL, K, T, sx, shape, BLOCK_T)
                gw0, gw1, gw2, gw3, gh0, gh1, gs = _load_chunks(base_ptr, high_ptr, scale_ptr, rows_c, rmask,
                                                                cg, KC_TOTAL, base_row, high_row, scale_row,
                                                                FMT, None, L2_HINT)
                a0, a1, a2, a3 = _dot_chunks(a0, a1, a2, a3, gw0, gw1, gw2, gw3, gh0, gh1, gs, xa, xb, xc,
                                             xd, FMT, BLOCK_T, CHAIN)
                if EPI == 1:
                    uw0, uw1, uw2, uw3, uh0, uh1, us = _load_chunks(base_ptr, high_ptr, scale_ptr,
                                                                    rows_c + up_off, rmask, cg, KC_TOTAL,
                                                                    base_row, high_row, scale_row, FMT, None, L2_HINT)
                    u0, u1, u2, u3 = _dot_chunks(u0, u1, u2, u3, uw0, uw1, uw2, uw3, uh0, uh1, us, xa, xb,
                                                 xc, xd, FMT, BLOCK_T, CHAIN)
            else:
                cmask = cg < KC_TOTAL
                a0, a1, a2, a3 = _rows_plain(a0, a1, a2, a3, x_ptr, base_ptr, high_ptr, scale_ptr, rows,
                                             rmask, cg, cmask, base_row, high_row, scale_row, K, T, sx, FMT,
                                             BLOCK_T)
                if EPI == 1:
                    u0, u1, u2, u3 = _rows_plain(u0, u1, u2, u3, x_ptr, base_ptr, high_ptr, scale_ptr,
                                                 rows + up_off, rmask, cg, cmask, base_row, high_row,
                                                 scale_row, K, T, sx, FMT, BLOCK_T)
    # the same per-column reduce + epilogue/partial store as the plain GEMV
    _finish(a0, a1, a2, a3, u0, u1, u2, u3, rows, rmask, T, N_OUT, out_ptr, res_ptr, ws_ptr,
            so, sr, pid_k, EPI, SPLIT_K, BLOCK_T, INTERP)
    if SPLIT_K > 1:
        if FUSED_REDUCE:
            splitk_fixup(ws_ptr, cnt_ptr, out_ptr, res_ptr, pid_n, pid_n * BLOCK_N, T, N_OUT, so, sr,
                         SPLIT_K, EPI, BLOCK_N, BLOCK_T, INTERP)


# ---------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------
def _route(name):
    from .routes import LOWREG_ROUTES
    route = LOWREG_ROUTES.get(name)
    if route is None:
        raise RouteError(f"unknown low-register GEMV route {name!r}")
    return route


def resolve_use_asm(use_asm, code: int, x: torch.Tensor, weight, k: int) -> bool:
    """USE_ASM auto/True/False -> whether the inline-PTX path runs. The packed path reads 16-byte
    chunks of x and of the base plane, so it needs K % 8 == 0, 16-byte aligned x rows and a
    16-byte aligned base plane (always true for payloads from a 16-byte aligned buffer)."""
    aligned = (k % 8 == 0 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
               and weight.words().data_ptr() % 16 == 0)
    if code == 6:
        aligned = aligned and weight.high_words().data_ptr() % 8 == 0
    if use_asm is True:
        return aligned
    if use_asm == "auto":
        return aligned and asm_supported(x.device)
    return False


def launch_lowreg(route_name: str, x, weight, out, *, epilogue: str = "none", residual=None,
                  workspace=None, params=None) -> None:
    route = _route(route_name)
    if not isinstance(weight, QuantWeight):
        raise RouteError(f"route {route.name}: weight must be a row-split QuantWeight, got "
                         f"{type(weight).__name__}")
    fmt, n, k, T, n_out, p = check_call(route, x, weight, out, epilogue, residual, params)
    if p["ASYNC"] and (p["PREFETCH"] or p["L2_HINT"]):
        raise RouteError(f"route {route.name}: ASYNC={p['ASYNC']} replaces the register prefetch and the asm loads' "
                         f"L2 hint: PREFETCH and L2_HINT must be false with it")
    res = residual if epilogue == "residual" else out
    split_k = p["SPLIT_K"]
    ws = splitk_workspace(route, split_k, T, n_out, epilogue, workspace, out)
    fused = split_k > 1 and p["REDUCE"] == "fused" and triton.cdiv(n_out, p["BLOCK_N"]) <= FIXUP_COUNTERS
    cnt = fixup_counters(out) if fused else out
    code = _FMT_CODE[fmt]
    use_asm = p["USE_ASM"]
    if use_asm is True and not asm_supported(x.device):
        raise RouteError(f"route {route.name}: USE_ASM=True needs a CUDA sm_90+ device outside the "
                         f"Triton interpreter")
    use_asm = resolve_use_asm(use_asm, code, x, weight, k)
    base, high, scale = weight.words(), weight.high_words(), weight.scales()
    base_row = weight.base_row_bytes // 4
    high_row = weight.high_row_bytes // 4
    scale_row = weight.groups_per_row
    kc_total = weight.k_pad // 32
    kc = p["BLOCK_K"] // 32
    n_iters = triton.cdiv(kc_total, kc)
    ips = triton.cdiv(n_iters, split_k)
    block_t = triton.next_power_of_2(T)
    grid = (triton.cdiv(n_out, p["BLOCK_N"]), split_k)
    epi = EPI_CODES[epilogue]
    gemv_lowreg_kernel[grid](
        x, base, high, scale, out, res, ws, cnt,
        T, k, n_out, kc_total, base_row, high_row, scale_row, n_out,
        x.stride(0), out.stride(0), res.stride(0), ips,
        FMT=code, EPI=epi, BLOCK_N=p["BLOCK_N"], BLOCK_K=p["BLOCK_K"], BLOCK_T=block_t,
        SPLIT_K=split_k, CHAIN=p["CHAIN"], INTERP=interpreting(), USE_ASM=use_asm,
        PREFETCH=bool(p["PREFETCH"]), L2_HINT=bool(p["L2_HINT"]), FUSED_REDUCE=fused, ASYNC=p["ASYNC"],
        num_warps=p["num_warps"],
        num_stages=p["num_stages"],
        **({"maxnreg": p["MAXNREG"]} if p["MAXNREG"] and not interpreting() else {}), **pdl_launch(gemv_lowreg_kernel))
    if not fused:
        reduce_split_k(ws, out, res, T, n_out, split_k, epi)
    return None


q4_gemv_lowreg = named_launcher(launch_lowreg, "q4_gemv_lowreg", "Launch low-register GEMV route `q4_gemv_lowreg`.")
q5_gemv_lowreg = named_launcher(launch_lowreg, "q5_gemv_lowreg", "Launch low-register GEMV route `q5_gemv_lowreg`.")
q6_gemv_lowreg = named_launcher(launch_lowreg, "q6_gemv_lowreg", "Launch low-register GEMV route `q6_gemv_lowreg`.")
