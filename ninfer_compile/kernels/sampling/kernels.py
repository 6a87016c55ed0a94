"""Triton kernels of greedy / Gumbel-max token selection (two-stage reduction over V).

Stage 1 (grid (T, NB)): each program reduces BLOCK logits of one row to (max, first index) and
writes both to the float32 workspace [T, NB, 2] (indices < 2^24 are exact in float32). With
GUMBEL it maximises logits / temperature + Gumbel noise, the noise drawn by tl.rand(seed, t*V+col)
(counter-based Philox: deterministic for a seed, independent of the launch shape).
Stage 2 (grid (T,)): reduces the NB partials, ties to the lowest index.
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter


@triton.jit
def select_stage1_kernel(logits_ptr, ws_ptr, V, NB, stride_lt, inv_temp, seed,
                         GUMBEL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t = tl.program_id(0)
    b = tl.program_id(1)
    cols = b * BLOCK + tl.arange(0, BLOCK)
    m = cols < V
    x = tl.load(logits_ptr + t.to(tl.int64) * stride_lt + cols, mask=m, other=-float("inf")).to(tl.float32)
    if GUMBEL:
        u = tl.rand(seed, t * V + cols)  # int32 counter: T * V < 2^31
        u = tl.minimum(tl.maximum(u, 1e-10), 1.0 - 1e-7)
        x = x * inv_temp - tl.log(-tl.log(u))
        x = tl.where(m, x, -float("inf"))
    mx = tl.max(x, axis=0)
    idx = tl.min(tl.where((x == mx) & m, cols, 2147483647), axis=0)
    base = (t * NB + b) * 2
    tl.store(ws_ptr + base, mx)
    tl.store(ws_ptr + base + 1, idx.to(tl.float32))


@triton.jit
def select_stage2_kernel(ws_ptr, out_ptr, NB, BS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t = tl.program_id(0)
    i = tl.arange(0, BS)
    m = i < NB
    v = tl.load(ws_ptr + (t * NB + i) * 2, mask=m, other=-float("inf"))
    idx = tl.load(ws_ptr + (t * NB + i) * 2 + 1, mask=m, other=3.0e9)
    mx = tl.max(v, axis=0)
    best = tl.min(tl.where((v == mx) & m, idx, 3.0e9), axis=0)
    tl.store(out_ptr + t, best.to(tl.int32))
