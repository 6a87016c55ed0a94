"""Triton kernel of `state_select` (spec.py): roll each verify row's slot back to its accepted column.

state_select_kernel  grid (C rows, cdiv(N, BLOCK)), N = elements per slot (the state flattened per
                     slot; any dtype: a plain copy). Row r with accepted[r] outside [0, K) copies
                     nothing (the whole program is skipped: no loads, no stores).
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def state_select_kernel(state_ptr, cols_ptr, acc_ptr, slots_ptr, N, K,
                        stride_ss, stride_cr, stride_cj,
                        BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    r = tl.program_id(0)
    a = tl.load(acc_ptr + r)
    if (a >= 0) & (a < K):
        s = tl.load(slots_ptr + r * (K + 1)).to(tl.int64)
        offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        src = cols_ptr + r.to(tl.int64) * stride_cr + a.to(tl.int64) * stride_cj
        v = tl.load(src + offs, mask=m)
        tl.store(state_ptr + s * stride_ss + offs, v, mask=m)
