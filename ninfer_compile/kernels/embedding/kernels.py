"""Triton kernels of the token-embedding lookup.

embed_rowsplit_kernel reads one row of a `row-split-k128-v1` table straight from its three planes
(storage-layouts §3): base nibbles (lane 2j low, 2j+1 high nibble of byte j of the group), high
bits (Q5: 1 bit/lane, Q6: 2 bits/lane, lane-major little-endian bit order), one binary16 scale
per group; W8: one two's-complement byte per lane. Value = float32(scale) * code -> out dtype.
Table row = id - first; an id outside [first, first + rows) writes zeros (a vocabulary-parallel
rank's slice; first = 0, rows = V for the whole table). Grid (T, cdiv(H, BLOCK)).
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def embed_rowsplit_kernel(
    ids_ptr, base_ptr, high_ptr, scale_ptr, out_ptr,
    H, gpr, stride_ot, first, rows,
    BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(ids_ptr + t).to(tl.int64) - first
    inside = (row >= 0) & (row < rows)
    row = tl.where(inside, row, 0)  # (row 0 is read, then zeroed: the masks stay vectors)
    m = cols < H
    grp = cols // GROUP
    lane = cols % GROUP
    if BITS == 8:
        b = tl.load(base_ptr + row * (gpr * 32) + grp * 32 + lane, mask=m, other=0).to(tl.int32)
        code = tl.where(b >= 128, b - 256, b)
    else:
        byte = tl.load(base_ptr + row * (gpr * 32) + grp * 32 + lane // 2, mask=m, other=0).to(tl.int32)
        u = (byte >> ((lane % 2) * 4)) & 15
        if BITS == 5:
            hb = tl.load(high_ptr + row * (gpr * 8) + grp * 8 + lane // 8, mask=m, other=0).to(tl.int32)
            u = u | (((hb >> (lane % 8)) & 1) << 4)
        if BITS == 6:
            hb = tl.load(high_ptr + row * (gpr * 16) + grp * 16 + lane // 4, mask=m, other=0).to(tl.int32)
            u = u | (((hb >> ((lane % 4) * 2)) & 3) << 4)
        half: tl.constexpr = 1 << (BITS - 1)
        code = tl.where(u >= half, u - 2 * half, u)
    sc = tl.where(inside, tl.load(scale_ptr + row * gpr + grp, mask=m, other=0.0).to(tl.float32), 0.0)
    tl.store(out_ptr + t * stride_ot + cols, (sc * code.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def embed_dense_kernel(ids_ptr, table_ptr, out_ptr, H, stride_tr, stride_ot, first, rows, BLOCK: tl.constexpr,
                       PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(ids_ptr + t).to(tl.int64) - first
    inside = (row >= 0) & (row < rows)
    row = tl.where(inside, row, 0)
    m = cols < H
    x = tl.load(table_ptr + row * stride_tr + cols, mask=m, other=0.0)
    x = tl.where(inside, x, 0.0)
    tl.store(out_ptr + t * stride_ot + cols, x.to(out_ptr.dtype.element_ty), mask=m)
