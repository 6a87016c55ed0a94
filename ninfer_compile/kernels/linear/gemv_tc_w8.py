"""Tensor-core decode GEMV for the row-split W8 G32 planes: route `w8_gemv_tc` (registered in
`routes.py`, PTX text in `ptx.py`; the Q4 / Q5 / Q6 version of the same schedule is `gemv_tc.py`,
whose loads, stores, epilogue and fragment layout this kernel reuses).

Work split as in gemv_tc: one warp = 16 weight rows, lane (g, c) = (lane // 4, lane % 4) owns rows g
and g + 8 of its warp's tile; a K step is 128 lanes (one row-split k128 block). W8 stores one byte
per lane, so a row's step is 128 bytes: lane c reads two 16-byte chunks of it, chunk 0 = bytes
16c .. 16c+15 and chunk 1 = bytes 64 + 16c .. 64 + 16c + 15 (each warp-wide load of the 4 lanes of a
row covers 64 contiguous bytes: whole sectors). Each chunk lies inside one G32 group (groups
kb*4 + c//2 and kb*4 + 2 + c//2): one fp16 scale per chunk and row.

K permutation shared by the A and B fragments: word j (0..7) of the lane's 8 words holds K lanes
L_j .. L_j + 3 (L_j = 16c + 4j for j < 4, 64 + 16c + 4(j-4) for j >= 4); mma j takes them as
A registers {P0, Q0, P1, Q1} (P = row g, Q = row g+8; P0 = lanes L_j, L_j+1, P1 = L_j+2, L_j+3) and B
registers {x pair 2j, x pair 2j+1} of the column's 16 x registers, loaded as 4 x 16-byte loads of x
words kb*16 + 2c + {0, 1, 8, 9} (register 4 L + p = pair p of load L). So every operand is still one
16-byte load, no shuffles, no shared memory; 8 mma per K step and column tile (as gemv_tc).

Dequant per lane pair (exact, no I2F): prmt puts the two code bytes in the low bytes of a bf16x2;
lop3 (b & 0x7F) | 0x4300 = bf16 (128 + low 7 bits); lop3 (b & 0x80) | 0xC300 = bf16 -128 or -256
(the code's sign bit lands on the exponent's lowest bit); one fma.rn.bf16x2 adds them: the two's
complement code q exactly (bf16 holds every integer of [-256, 256]). Then one fma.rn.bf16x2 with
-0 multiplies by the group scale (rounded to bf16): the weight bf16(q * bf16(s)), as gemv_tc does.

USE_ASM=False (always under the interpreter) runs `w8_small_t_mma` instead (same math up to
rounding); the PTX K step is checked by the bit-level warp emulation in the tests.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...errors import RouteError
from .epilogue import EPI_CODES, FIXUP_COUNTERS, fixup_counters, splitk_fixup
from .gemv_tc import LD4, LDS, LDX, MAX_T, _addr, _ld4, _route, _store
from .launch import asm_supported, check_call, named_launcher, reduce_split_k, splitk_workspace
from .ptx import tc_w8_step_asm_source, tc_w8_step_constraints
from .routes import linear_workspace_numel  # noqa: F401  (the family's sizing hook, on each launcher module)
from .weights import QuantWeight
from ..pdl import pdl_enter
from ..pdl import pdl_launch

TCW8_1 = tl.constexpr(tc_w8_step_asm_source(1))
TCW8_2 = tl.constexpr(tc_w8_step_asm_source(2))
TCCW8_1 = tl.constexpr(tc_w8_step_constraints(1))
TCCW8_2 = tl.constexpr(tc_w8_step_constraints(2))


@triton.jit
def _x_tile_w8(x_ptr, col, T, sx, word0, kw_last):
    """Column `col`'s 4 x 16-byte loads (x words word0 + 0, 1, 8, 9, clamped to the last word of K;
    columns >= T read column 0: finite, never stored)."""
    cc = tl.where(col < T, col, 0)
    row = x_ptr + cc * sx
    a0, a1, a2, a3 = _ld4(row + tl.minimum(word0 + 0, kw_last) * 8, LDX)
    b0, b1, b2, b3 = _ld4(row + tl.minimum(word0 + 1, kw_last) * 8, LDX)
    c0, c1, c2, c3 = _ld4(row + tl.minimum(word0 + 8, kw_last) * 8, LDX)
    d0, d1, d2, d3 = _ld4(row + tl.minimum(word0 + 9, kw_last) * 8, LDX)
    return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3)


@triton.jit
def _rows_w8(base_ptr, scale_ptr, row, kb, ci, base_row, scale_row):
    """Row `row`'s two chunks of K step kb for lane c: 8 words and the two chunks' fp32 scales."""
    wp = base_ptr + row * base_row + kb * 32 + ci * 4
    w0, w1, w2, w3 = _ld4(wp, LD4)
    w4, w5, w6, w7 = _ld4(wp + 16, LD4)
    sp = scale_ptr + row * scale_row + kb * 4 + ci // 2
    s0 = tl.inline_asm_elementwise(LDS, "=f,l", [_addr(sp)], dtype=tl.float32, is_pure=True, pack=1)
    s1 = tl.inline_asm_elementwise(LDS, "=f,l", [_addr(sp + 2)], dtype=tl.float32, is_pure=True, pack=1)
    return w0, w1, w2, w3, w4, w5, w6, w7, s0, s1


@triton.jit
def _step_w8(acc, wg, wh, xa, xb, N_TILES: tl.constexpr):
    """One asm call: acc (8-tuple, tiles 0 and 1) += this K step's products."""
    gw0, gw1, gw2, gw3, gw4, gw5, gw6, gw7, sg0, sg1 = wg
    hw0, hw1, hw2, hw3, hw4, hw5, hw6, hw7, sh0, sh1 = wh
    words = (gw0, gw1, gw2, gw3, gw4, gw5, gw6, gw7, hw0, hw1, hw2, hw3, hw4, hw5, hw6, hw7, sg0, sg1, sh0, sh1)
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    if N_TILES == 1:
        r0, r1, r2, r3 = tl.inline_asm_elementwise(TCW8_1, TCCW8_1, (a0, a1, a2, a3) + words + xa,
                                                   dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                                   is_pure=True, pack=1)
        out = (r0, r1, r2, r3, a4, a5, a6, a7)
    else:
        out = tl.inline_asm_elementwise(TCW8_2, TCCW8_2, (a0, a1, a2, a3, a4, a5, a6, a7) + words + xa + xb,
                                        dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32,
                                               tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    return out


@triton.jit
def gemv_tc_w8_kernel(x_ptr, base_ptr, scale_ptr, out_ptr, res_ptr, ws_ptr, cnt_ptr,
                      T, K, N_OUT, KB_TOTAL, base_row, scale_row, up_off, sx, so, sr, iters_per_split,
                      EPI: tl.constexpr, N_TILES: tl.constexpr, SPLIT_K: tl.constexpr, NW: tl.constexpr,
                      PREFETCH: tl.constexpr = False, FUSED_REDUCE: tl.constexpr = False,
                      PDL: tl.constexpr = False):
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    # [NW, 8, 4]: warp, g = lane // 4, c = lane % 4 (the mma fragment owners)
    wi = tl.arange(0, NW)[:, None, None]
    gi = tl.arange(0, 8)[None, :, None]
    ci = tl.arange(0, 4)[None, None, :]
    zero_i = wi * 0 + gi * 0 + ci * 0
    row_g = pid_n * 16 * NW + wi * 16 + gi + zero_i
    row_h = row_g + 8
    rg = tl.minimum(row_g, N_OUT - 1)
    rh = tl.minimum(row_h, N_OUT - 1)
    col0 = gi + zero_i
    ci3 = ci + zero_i
    kw_last = K // 8 - 1
    z = tl.zeros([NW, 8, 4], tl.float32)
    # accumulators as separate loop-carried values (tile 0: c0..c3, tile 1: c4..c7; up rows: u*)
    c0, c1, c2, c3, c4, c5, c6, c7 = z, z, z, z, z, z, z, z
    u0, u1, u2, u3, u4, u5, u6, u7 = z, z, z, z, z, z, z, z
    kb0 = pid_k * iters_per_split
    kb1 = tl.minimum(kb0 + iters_per_split, KB_TOTAL)
    if PREFETCH:
        # register double buffer (as gemv_tc): the next K step's chunks and scales load before this
        # step's dequant + mma; the load after the last step re-reads the last step (an L2 hit)
        kp = tl.minimum(kb0, KB_TOTAL - 1)
        g0, g1, g2, g3, g4, g5, g6, g7, g8, g9 = _rows_w8(base_ptr, scale_ptr, rg, kp, ci3, base_row, scale_row)
        h0, h1, h2, h3, h4, h5, h6, h7, h8, h9 = _rows_w8(base_ptr, scale_ptr, rh, kp, ci3, base_row, scale_row)
        p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = g0, g1, g2, g3, g4, g5, g6, g7, g8, g9
        q0, q1, q2, q3, q4, q5, q6, q7, q8, q9 = h0, h1, h2, h3, h4, h5, h6, h7, h8, h9
        if EPI == 1:
            p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = _rows_w8(base_ptr, scale_ptr, rg + up_off, kp, ci3, base_row,
                                                              scale_row)
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9 = _rows_w8(base_ptr, scale_ptr, rh + up_off, kp, ci3, base_row,
                                                              scale_row)
        for kb in range(kb0, kb1):
            kn = tl.minimum(kb + 1, kb1 - 1)
            ng = _rows_w8(base_ptr, scale_ptr, rg, kn, ci3, base_row, scale_row)
            nh = _rows_w8(base_ptr, scale_ptr, rh, kn, ci3, base_row, scale_row)
            nug = ng
            nuh = nh
            if EPI == 1:
                nug = _rows_w8(base_ptr, scale_ptr, rg + up_off, kn, ci3, base_row, scale_row)
                nuh = _rows_w8(base_ptr, scale_ptr, rh + up_off, kn, ci3, base_row, scale_row)
            word0 = kb * 16 + ci3 * 2
            xa = _x_tile_w8(x_ptr, col0, T, sx, word0, kw_last)
            xb = xa
            if N_TILES == 2:
                xb = _x_tile_w8(x_ptr, col0 + 8, T, sx, word0, kw_last)
            c0, c1, c2, c3, c4, c5, c6, c7 = _step_w8((c0, c1, c2, c3, c4, c5, c6, c7),
                                                      (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9),
                                                      (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9), xa, xb, N_TILES)
            if EPI == 1:
                u0, u1, u2, u3, u4, u5, u6, u7 = _step_w8((u0, u1, u2, u3, u4, u5, u6, u7),
                                                          (p0, p1, p2, p3, p4, p5, p6, p7, p8, p9),
                                                          (q0, q1, q2, q3, q4, q5, q6, q7, q8, q9), xa, xb, N_TILES)
            g0, g1, g2, g3, g4, g5, g6, g7, g8, g9 = ng
            h0, h1, h2, h3, h4, h5, h6, h7, h8, h9 = nh
            p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = nug
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9 = nuh
    else:
        for kb in range(kb0, kb1):
            word0 = kb * 16 + ci3 * 2
            xa = _x_tile_w8(x_ptr, col0, T, sx, word0, kw_last)
            xb = xa
            if N_TILES == 2:
                xb = _x_tile_w8(x_ptr, col0 + 8, T, sx, word0, kw_last)
            wg = _rows_w8(base_ptr, scale_ptr, rg, kb, ci3, base_row, scale_row)
            wh = _rows_w8(base_ptr, scale_ptr, rh, kb, ci3, base_row, scale_row)
            c0, c1, c2, c3, c4, c5, c6, c7 = _step_w8((c0, c1, c2, c3, c4, c5, c6, c7), wg, wh, xa, xb, N_TILES)
            if EPI == 1:
                ug = _rows_w8(base_ptr, scale_ptr, rg + up_off, kb, ci3, base_row, scale_row)
                uh = _rows_w8(base_ptr, scale_ptr, rh + up_off, kb, ci3, base_row, scale_row)
                u0, u1, u2, u3, u4, u5, u6, u7 = _step_w8((u0, u1, u2, u3, u4, u5, u6, u7), ug, uh, xa, xb,
                                                          N_TILES)
    # fragment: register i of tile t = out[row (g if i < 2 else g + 8)][column 8 t + 2 c + (i % 2)]
    mg = row_g < N_OUT
    mh = row_h < N_OUT
    ca = ci3 * 2
    _store(c0, u0, row_g, ca, mg & (ca < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    _store(c1, u1, row_g, ca + 1, mg & (ca + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    _store(c2, u2, row_h, ca, mh & (ca < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    _store(c3, u3, row_h, ca + 1, mh & (ca + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
    if N_TILES == 2:
        cb = ca + 8
        _store(c4, u4, row_g, cb, mg & (cb < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
        _store(c5, u5, row_g, cb + 1, mg & (cb + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI,
               SPLIT_K)
        _store(c6, u6, row_h, cb, mh & (cb < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI, SPLIT_K)
        _store(c7, u7, row_h, cb + 1, mh & (cb + 1 < T), out_ptr, res_ptr, ws_ptr, pid_k, T, N_OUT, so, sr, EPI,
               SPLIT_K)
    if SPLIT_K > 1:
        if FUSED_REDUCE:
            splitk_fixup(ws_ptr, cnt_ptr, out_ptr, res_ptr, pid_n, pid_n * 16 * NW, T, N_OUT, so, sr,
                         SPLIT_K, EPI, 16 * NW, 16, False)


# ---------------------------------------------------------------------------------------------
# launcher (the gemv_tc launcher's contract: T > 16 in 16-column slices, the small_t_mma fallback)
# ---------------------------------------------------------------------------------------------
def launch_tc_w8(route_name: str, x, weight, out, *, epilogue: str = "none", residual=None, workspace=None,
                 params=None) -> None:
    route = _route(route_name)
    if not isinstance(weight, QuantWeight):
        raise RouteError(f"route {route.name}: weight must be a row-split QuantWeight, got {type(weight).__name__}")
    fmt, n, k, T, n_out, p = check_call(route, x, weight, out, epilogue, residual, params)
    if T > MAX_T:
        for c0 in range(0, T, MAX_T):
            c1 = min(T, c0 + MAX_T)
            launch_tc_w8(route_name, x[c0:c1], weight, out[c0:c1], epilogue=epilogue,
                         residual=None if residual is None else residual[c0:c1], workspace=workspace, params=params)
        return None
    use_asm = p["USE_ASM"]
    if use_asm is True and not asm_supported(x.device):
        raise RouteError(f"route {route.name}: USE_ASM=True needs a CUDA sm_90+ device outside the Triton interpreter")
    aligned = (k % 8 == 0 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
               and weight.words().data_ptr() % 16 == 0 and weight.scales().data_ptr() % 2 == 0)
    use_asm = aligned and (use_asm is True or (use_asm == "auto" and asm_supported(x.device)))
    if not use_asm:
        # same math (dequantized bf16 weights, fp32 accumulation) through the tiled tensor-core kernel
        from .launch import launch
        fb = {"BLOCK_T": 16, "SPLIT_K": p["SPLIT_K"], "USE_ASM": False}
        return launch("w8_small_t_mma", x, weight, out, epilogue=epilogue, residual=residual,
                      workspace=workspace, params=fb)
    res = residual if epilogue == "residual" else out
    split_k = p["SPLIT_K"]
    ws = splitk_workspace(route, split_k, T, n_out, epilogue, workspace, out)
    nw = p["num_warps"]
    fused = split_k > 1 and p["REDUCE"] == "fused" and triton.cdiv(n_out, 16 * nw) <= FIXUP_COUNTERS
    cnt = fixup_counters(out) if fused else out
    kb_total = weight.k_pad // 128
    ips = triton.cdiv(kb_total, split_k)
    grid = (triton.cdiv(n_out, 16 * nw), split_k)
    epi = EPI_CODES[epilogue]
    gemv_tc_w8_kernel[grid](
        x, weight.words(), weight.scales(), out, res, ws, cnt,
        T, k, n_out, kb_total, weight.base_row_bytes // 4, weight.groups_per_row,
        n_out, x.stride(0), out.stride(0), res.stride(0), ips,
        EPI=epi, N_TILES=1 if T <= 8 else 2, SPLIT_K=split_k, NW=nw, PREFETCH=bool(p["PREFETCH"]),
        FUSED_REDUCE=fused, num_warps=nw, num_stages=1, **({"maxnreg": p["MAXNREG"]} if p["MAXNREG"] else {}),
        **pdl_launch(gemv_tc_w8_kernel))
    if not fused:
        reduce_split_k(ws, out, res, T, n_out, split_k, epi)
    return None


w8_gemv_tc = named_launcher(launch_tc_w8, "w8_gemv_tc", "Launch tensor-core GEMV route `w8_gemv_tc`.")
