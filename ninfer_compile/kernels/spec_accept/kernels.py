"""Triton kernels of speculative acceptance (the rule: spec.py; the oracle: reference.py).

The launch (launch.py) runs four kernels over the float32 workspace (sizing.py):
1. sampling's `block_max_kernel`  grid (T, NB): per-block raw max / first index -> partials A.
2. sampling's `threshold_kernel`  grid (T,): per column the argmax (greedy columns also write it to
   `tokens`) and, for sampling columns, the exact top-k / top-p keep threshold tau over
   x = logits / temperature -> the column records [T, 2] (tau, argmax).
3. `residual_block_kernel`        grid (T, NB): sampling columns that can stop their row only
   (j <= n_drafts[r]): per block, the kept mass sum(exp(x - x_max) over x >= tau) and the Gumbel-max
   over the kept tokens, without the column's draft d = ids[c + 1] where the draft is real
   (j < n_drafts[r]: the residual p_j - onehot(d), renormalised, is what a rejection draws from) and
   over all kept tokens at j = n_drafts[r] (the bonus / a plain sample) -> partials B [T, NB, 3].
4. `accept_rows_kernel`           grid (C,): walks row r's columns in order: greedy columns accept
   iff d == argmax; sampling columns accept iff u_c < p_j(d) = exp(x_d - x_max) / z (0 when d is
   not kept); the first rejection (or column n_drafts[r]) writes its own token (argmax, or the
   Gumbel winner of step 3) and `accepted[r]`.

Noise streams, all Philox with key = seed[c] (64 bits) and the column's sample_pos[c] = pos:
- residual / bonus draw: Gumbel noise of token t = Philox counter (t, pos, 0, 0) word 0, exactly
  the sampling family's (sampling.kernels.gumbel), so a bonus / cut column draws the token a plain
  sampling step at that seed and position would (residual columns: the same noise, d excluded);
- accept test: u_c = Philox counter (0, pos, 1, 0) word 0 as a uniform in [0, 1) (clamped below 1),
  a different counter (third word 1) from every Gumbel counter, so independent of the draw.
Neither depends on the row's index, C, W or the launch shape.
"""

import triton
import triton.language as tl

from ..pdl import pdl_enter
from ..sampling.kernels import _BIG, _uniform, gumbel, row_seed


@triton.jit
def residual_block_kernel(logits_ptr, ids_ptr, n_drafts_ptr, temp_ptr, seed_ptr, pos_ptr, ws_ptr, row_ptr,
                          V, NB, W, stride_lt, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    c = tl.program_id(0)
    b = tl.program_id(1)
    r = c // W
    j = c - r * W
    n = tl.minimum(tl.maximum(tl.load(n_drafts_ptr + r), 0), W - 1)
    temp = tl.load(temp_ptr + c)
    if (temp > 0) & (j <= n):
        row = logits_ptr + c.to(tl.int64) * stride_lt
        tau = tl.load(row_ptr + c * 2)
        best = tl.load(row_ptr + c * 2 + 1).to(tl.int32)
        xm = tl.load(row + best).to(tl.float32) / temp  # max(x), as threshold_kernel's
        d = tl.load(ids_ptr + c + 1, mask=j < n, other=-1)  # -1: nothing excluded
        seed = row_seed(seed_ptr, c)
        pos = tl.load(pos_ptr + c).to(tl.uint32, bitcast=True)
        cols = b * BLOCK + tl.arange(0, BLOCK)
        m = cols < V
        x = tl.load(row + cols, mask=m, other=-float("inf")).to(tl.float32) / temp
        keep = m & (x >= tau)
        zp = tl.sum(tl.where(keep, tl.exp(x - xm), 0.0), axis=0)
        cand = keep & (cols != d)
        s = tl.where(cand, x + gumbel(seed, pos, cols), -float("inf"))
        mx = tl.max(s, axis=0)
        idx = tl.min(tl.where((s == mx) & cand, cols, _BIG), axis=0)
        base = (c * NB + b) * 3
        tl.store(ws_ptr + base, mx)
        tl.store(ws_ptr + base + 1, idx.to(tl.float32))
        tl.store(ws_ptr + base + 2, zp)


@triton.jit
def accept_rows_kernel(logits_ptr, ids_ptr, n_drafts_ptr, temp_ptr, seed_ptr, pos_ptr, ws_ptr, row_ptr,
                       tokens_ptr, accepted_ptr, V, NB, W, stride_lt, BS: tl.constexpr,
                       PDL: tl.constexpr = False):
    pdl_enter(PDL)
    r = tl.program_id(0)
    n = tl.minimum(tl.maximum(tl.load(n_drafts_ptr + r), 0), W - 1)
    i = tl.arange(0, BS)
    lane = tl.arange(0, 2)
    lz = tl.zeros((2,), tl.uint32)
    live = tl.zeros((), tl.int32) + 1  # 1 until the row's stop column
    acc = n
    for j in range(0, W):
        c = r * W + j
        active = live != 0
        real = j < n
        # scalar loads read a safe address instead of a masked one (scalar masks: not in the interpreter)
        d = tl.where(real, tl.load(ids_ptr + tl.where(real, c + 1, c)), -1)
        dv = (d >= 0) & (d < V)
        best = tl.load(row_ptr + c * 2 + 1).to(tl.int32)  # every column has its record
        temp = tl.load(temp_ptr + c)
        sampled = active & (temp > 0)
        # sampling column: the reduced partials B, p_j(d) and the accept uniform
        ms = i < tl.where(sampled, NB, 0)  # (a scalar-bool & vector mask fails in the interpreter)
        v = tl.load(ws_ptr + (c * NB + i) * 3, mask=ms, other=-float("inf"))
        vi = tl.load(ws_ptr + (c * NB + i) * 3 + 1, mask=ms, other=3.0e9)
        z = tl.sum(tl.load(ws_ptr + (c * NB + i) * 3 + 2, mask=ms, other=0.0), axis=0)
        gmx = tl.max(v, axis=0)
        g = tl.min(tl.where((v == gmx) & ms, vi, 3.0e9), axis=0)
        gtok = tl.where(g < 3.0e9, g, best.to(tl.float32)).to(tl.int32)  # empty residual: the argmax
        row = logits_ptr + c.to(tl.int64) * stride_lt
        tsafe = tl.where(temp > 0, temp, 1.0)
        tau = tl.load(row_ptr + c * 2)
        xm = tl.load(row + best).to(tl.float32) / tsafe
        xd = tl.load(row + tl.where(dv, d, best)).to(tl.float32) / tsafe
        pd = tl.where(real & dv & (xd >= tau) & (z > 0), tl.exp(xd - xm) / tl.where(z > 0, z, 1.0), 0.0)
        seed = row_seed(seed_ptr, c)
        pos = tl.load(pos_ptr + c).to(tl.uint32, bitcast=True)
        u0, _u1, _u2, _u3 = tl.philox(seed, lz, lz + pos, lz + 1, lz)
        u = tl.sum(tl.where(lane == 0, _uniform(u0), 0.0), axis=0)
        u = tl.minimum(u, 0.99999994)
        ok = ((temp > 0) & real & (u < pd)) | ((temp <= 0) & real & (d == best))
        own = tl.where(temp > 0, gtok, best)
        tl.store(tokens_ptr + c + lane, tl.where(ok, d, own) + lane * 0, mask=lane < live)  # lane 0 while the row runs
        stop = active & (ok == 0)
        acc = tl.where(stop, j, acc)
        live = tl.where(ok, live, 0)
    tl.store(accepted_ptr + r + lane, acc + lane * 0, mask=lane == 0)
