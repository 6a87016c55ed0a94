"""The decode GEMVs' weight prefetch before their programmatic-dependent-launch wait (kernels/pdl.py).

A GEMV's weights are launch constants: no kernel of a decode step writes them, so a program may
start pulling them into L2 before `griddepcontrol.wait` returns, while the previous kernels (RMSNorm,
GDN gating / conv / delta rule, attention: ~1.1 ms of a C = 1 step in which DRAM streams almost
nothing) still run. Each program prefetches one contiguous span of each plane from its first row's
K start (`pdl_prefetch_rows`: cp.async.bulk.prefetch.L2, no register, no wait): PDL_PREFETCH_BYTES of
the base plane (halved between the gate and the up rows under swiglu) and the same K units of the
high-bit and scale planes. Rows are contiguous in every plane, so at SPLIT_K = 1 that is the first
bytes of the program's own rows; with split-K the span runs on into bytes other programs of the same
launch read. Only programs resident at launch overlap anything; a later wave's prefetch runs right
before its own loads (harmless: the same lines).
PDL_PREFETCH_BYTES = 0 or PDL off (prefill, eager, the interpreter): nothing is issued.

Contract (tests/kernels/test_pdl.py): these functions compute addresses from their arguments and
program ids only and touch memory through `pdl_prefetch_rows` alone.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..pdl import pdl_prefetch_rows


@triton.jit
def lowreg_prefetch(base_ptr, high_ptr, scale_ptr, N_OUT, up_off, base_row, high_row, scale_row,
                    iters_per_split, FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, PDL_PREFETCH_BYTES: tl.constexpr, PDL: tl.constexpr):
    """gemv_lowreg_kernel: K in 16-byte base chunks (4 base words, Q5 1 / Q6 2 high words, 1/2 scale)."""
    if PDL and PDL_PREFETCH_BYTES > 0:
        UNITS: tl.constexpr = PDL_PREFETCH_BYTES // (16 * (1 + (EPI == 1)))  # gate and up rows share it
        row0 = tl.program_id(0) * BLOCK_N
        lo = tl.program_id(1) * iters_per_split * (BLOCK_K // 32)
        for up in tl.static_range(1 + (EPI == 1)):
            r0 = row0 + up * up_off
            n_rows = N_OUT + up * up_off
            pdl_prefetch_rows(base_ptr, base_row, base_row, r0, lo, n_rows, UNITS, 4, 1, PDL)
            pdl_prefetch_rows(scale_ptr, scale_row, scale_row, r0, lo, n_rows, UNITS, 1, 2, PDL)
            if FMT != 4:
                pdl_prefetch_rows(high_ptr, high_row, high_row, r0, lo, n_rows, UNITS, FMT - 4, 1, PDL)


@triton.jit
def gemv_prefetch(base_ptr, high_ptr, scale_ptr, N_OUT, up_off, base_row, high_row, scale_row, K,
                  iters_per_split, FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PDL_PREFETCH_BYTES: tl.constexpr, PDL: tl.constexpr):
    """qlinear_gemv_kernel: K in bf16 lanes (FMT 16) or 32-bit base words (8 lanes; W8 4 lanes): per word
    1/8 scale (G64 of 8 lanes, G32 of 4), Q5 1/4 and Q6 1/2 high word."""
    if PDL and PDL_PREFETCH_BYTES > 0:
        UNIT: tl.constexpr = 2 if FMT == 16 else 4  # bytes of one K unit in the base plane
        STEP: tl.constexpr = BLOCK_K if FMT == 16 else BLOCK_K // (4 if FMT == 8 else 8)
        UNITS: tl.constexpr = PDL_PREFETCH_BYTES // (UNIT * (1 + (EPI == 1)))
        row0 = tl.program_id(0) * BLOCK_N
        lo = tl.program_id(1) * iters_per_split * STEP
        if FMT == 16:
            row_len = K  # a bf16 row may be a strided view: its own K lanes only
        else:
            row_len = base_row
        for up in tl.static_range(1 + (EPI == 1)):
            r0 = row0 + up * up_off
            n_rows = N_OUT + up * up_off
            pdl_prefetch_rows(base_ptr, base_row, row_len, r0, lo, n_rows, UNITS, 1, 1, PDL)
            if FMT != 16:
                pdl_prefetch_rows(scale_ptr, scale_row, scale_row, r0, lo, n_rows, UNITS, 1, 8, PDL)
            if FMT == 5 or FMT == 6:
                pdl_prefetch_rows(high_ptr, high_row, high_row, r0, lo, n_rows, UNITS, FMT - 4, 4, PDL)


@triton.jit
def w8_tc_prefetch(base_ptr, scale_ptr, N_OUT, up_off, base_row, scale_row, iters_per_split,
                   EPI: tl.constexpr, NW: tl.constexpr, PDL_PREFETCH_BYTES: tl.constexpr, PDL: tl.constexpr):
    """gemv_tc_w8_kernel: 16 rows per warp, K in 64-byte blocks (16 base words, 2 G32 scales)."""
    if PDL and PDL_PREFETCH_BYTES > 0:
        UNITS: tl.constexpr = PDL_PREFETCH_BYTES // (64 * (1 + (EPI == 1)))
        row0 = tl.program_id(0) * 16 * NW
        lo = tl.program_id(1) * iters_per_split
        for up in tl.static_range(1 + (EPI == 1)):
            r0 = row0 + up * up_off
            n_rows = N_OUT + up * up_off
            pdl_prefetch_rows(base_ptr, base_row, base_row, r0, lo, n_rows, UNITS, 16, 1, PDL)
            pdl_prefetch_rows(scale_ptr, scale_row, scale_row, r0, lo, n_rows, UNITS, 2, 1, PDL)
