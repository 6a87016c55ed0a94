"""The RMSNorm prologue of the linear kernels (and of gdn_gating_proj): x is replaced by
x * rstd * (1 + w), rstd = rsqrt(mean(x^2) + eps) of each column (token row) of x over all of K.

How the kernels apply it (`NORM` constexpr; the fuse rule `rmsnorm_prologue` removes the rmsnorm
launch that fed them):
- while streaming the weights, x is scaled by (1 + w) where the kernel loads it: fp32 multiply on
  the plain paths, one `fma.rn.bf16x2 x, w, x` per packed pair (= x * (1 + w), one rounding) on
  the inline-PTX paths, whose x stays packed bf16x2;
- rstd is a per-column scalar, so it is applied to the fp32 accumulators once, after the K loop
  (before the epilogue / the split-K partial store: both are linear in the accumulator up to the
  epilogue, which sees the normalised product). `row_rstd` re-reads the whole x row after the
  main loop, when it is L1/L2-hot, so the weight stream never waits for the reduction.
"""

from __future__ import annotations

import triton
import triton.language as tl

# x pair * (1 + w pair) in one bf16x2 FMA: x * w + x
SCALE_PAIR_ASM = tl.constexpr("fma.rn.bf16x2 $0, $1, $2, $1;")


def norm_block(k: int) -> int:
    """Elements per step of `row_rstd` (a power of two, at most 1024)."""
    return min(1024, triton.next_power_of_2(int(k)))


@triton.jit
def row_rstd(x_ptr, t, sx, K, T, eps, RB: tl.constexpr):
    """rsqrt(mean(x[t, :K]^2) + eps) in fp32 (column t >= T reads column 0: finite, never stored)."""
    tt = tl.where(t < T, t, 0)
    offs = tl.arange(0, RB)
    acc = tl.zeros([RB], tl.float32)
    for k0 in range(0, K, RB):
        kk = k0 + offs
        v = tl.load(x_ptr + tt * sx + kk, mask=kk < K, other=0.0).to(tl.float32)
        acc += v * v
    return tl.rsqrt(tl.sum(acc, axis=0) / K + eps)


@triton.jit
def norm_gain(nw_ptr, kk, K):
    """fp32 (1 + w[kk]) (0 past K)."""
    return tl.load(nw_ptr + kk, mask=kk < K, other=-1.0).to(tl.float32) + 1.0


@triton.jit
def scale_pair(xp, wp):
    """Packed bf16x2 x pair times (1 + w pair) (int32 bit patterns, elementwise)."""
    return tl.inline_asm_elementwise(SCALE_PAIR_ASM, "=r,r,r", [xp, wp], dtype=tl.int32, is_pure=True, pack=1)
