"""Triton kernel of `l2_prefetch`: bulk L2 prefetches of up to three byte spans, no registers held.

Program p covers bytes [p * PIECE, (p + 1) * PIECE) of the three spans laid end to end; each of its
32 lanes issues one `cp.async.bulk.prefetch.L2` for its PIECE / 32 bytes (clipped to the span it
falls in, up to one instruction per span it touches). Nothing is read into registers and nothing is
written, so the kernel reads no tensor of the step: under programmatic dependent launch it releases
the next grid first and waits for the previous grid last, keeping the stream's completion order
(a grid after this one that waits on it also waits on everything before it).
"""

import triton
import triton.language as tl

from ..pdl import pdl_release_first, pdl_wait_last

# [$1, $1 + $2) to L2 ($1 16-byte aligned, $2 a multiple of 16, skipped when 0); $0 a dummy result
PREFETCH_L2 = tl.constexpr("{ .reg .pred p; setp.gt.s32 p, $2, 0; "
                           "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")


@triton.jit
def _span(addr, start, nbytes, g, sub):
    """Prefetch each lane's share [g, g + sub) of the span that starts at byte `start` of the whole."""
    lo = tl.maximum(g, start)
    hi = tl.minimum(g + sub, start + nbytes)
    size = tl.where(hi > lo, hi - lo, 0).to(tl.int32)
    a = addr + tl.where(hi > lo, lo - start, 0)
    tl.inline_asm_elementwise(PREFETCH_L2, "=r,l,r", [a, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def issue_l2_prefetch(a0, n0, a1, n1, a2, n2, g, sub):
    """The three spans laid end to end; lane i of `g` (int64 byte offsets into the whole) issues
    [g_i, g_i + sub). Shared by this family's kernel and the kernels that carry a folded prefetch
    (rmsnorm: `prefetch` operand, see plan_l2_prefetch)."""
    _span(a0.to(tl.int64), 0, n0.to(tl.int64), g, sub)
    _span(a1.to(tl.int64), n0.to(tl.int64), n1.to(tl.int64), g, sub)
    _span(a2.to(tl.int64), (n0 + n1).to(tl.int64), n2.to(tl.int64), g, sub)


@triton.jit
def l2_prefetch_kernel(a0, n0, a1, n1, a2, n2, PIECE: tl.constexpr, PDL: tl.constexpr = False):
    pdl_release_first(PDL)
    SUB: tl.constexpr = PIECE // 32
    g = tl.program_id(0).to(tl.int64) * PIECE + tl.arange(0, 32).to(tl.int64) * SUB
    issue_l2_prefetch(a0, n0, a1, n1, a2, n2, g, SUB)
    pdl_wait_last(PDL)
