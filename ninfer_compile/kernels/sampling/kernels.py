"""Triton kernels of per-row token selection: greedy, or temperature / top-k / top-p sampling.

Each logits row r carries its own parameters, read from small device buffers (so one captured
CUDA graph serves rows with different settings): temperature[r] (<= 0: greedy), top_k[r]
(0: off), top_p[r] (>= 1: off), seed[r] (64 bits as two int32, low word first) and
sample_pos[r] (the position the sampled token will take: the noise counter).

Four launches, all over the float32 workspace (layout in launch.py):
1. `block_max_kernel`    grid (R, NB): per block of BLOCK logits, the raw maximum and its first
   index -> partials A [R, NB, 2] (indices < 2^24 are exact in float32).
2. `threshold_kernel`    grid (R,): reduces A to the row's maximum and argmax. A greedy row writes
   its id (argmax, ties to the lowest index) and is done. A sampled row finds the exact keep
   threshold tau over x = logits / temperature, by bisection over the order-preserving int32
   keys of float32 (32 steps, each a pass over the row): top-k: tau_k = the k-th largest x (keep
   x >= tau_k, ties kept, as reference.filtered_probs); then top-p: the smallest data value tau
   with sum(p[x > tau]) < top_p over the top-k survivors (keep x >= tau: the tokens whose
   higher-probability mass is below top_p). tau (or -inf) -> the row record.
3. `gumbel_block_kernel` grid (R, NB): sampled rows only: per block, the maximum of
   x + Gumbel noise over the kept tokens and its first index -> partials B [R, NB, 2]. The noise is
   Philox(key = seed[r], counter = (column, sample_pos[r], 0, 0)): it depends on the row's seed,
   position and the token only, never on the row's index or the launch shape.
4. `gumbel_final_kernel` grid (R,): sampled rows only: reduces B to the sampled id.
Gumbel-max over the kept set samples exactly softmax(x) restricted to it, renormalised.
"""

import triton
import triton.language as tl
from ..pdl import pdl_enter

_BIG = tl.constexpr(2147483647)  # a constexpr global: real Triton refuses a plain int global in @jit code


@triton.jit
def _key(x):
    """Order-preserving int32 key of float32 x (signed integer order = float order)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _unkey(k):
    b = tl.where(k < 0, k ^ 0x7FFFFFFF, k)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _uniform(x):
    """uint32 -> float32 uniform in [0, 1) (as triton.language.random.uint_to_uniform_float)."""
    x = x.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, -x - 1, x)
    return x.to(tl.float32) * 4.6566127342e-10


@triton.jit
def row_seed(seed_ptr, r):
    """The 64-bit Philox key of row r from seed [R, 2] int32 (low word first)."""
    lo = tl.load(seed_ptr + r * 2).to(tl.uint32, bitcast=True).to(tl.uint64)
    hi = tl.load(seed_ptr + r * 2 + 1).to(tl.uint32, bitcast=True).to(tl.uint64)
    return (hi << 32) | lo


@triton.jit
def gumbel(seed, pos, cols):
    """Gumbel(0, 1) noise of tokens `cols` (int32 block) at position `pos` (uint32):
    -log(-log(u)), u = Philox(key = seed, counter = (token, pos, 0, 0)) word 0 (shared with
    spec_accept: a bonus draw there is the draw this family makes at the same seed and position)."""
    c0 = cols.to(tl.uint32)
    c1 = tl.zeros_like(c0) + pos
    z = tl.zeros_like(c0)
    u0, _u1, _u2, _u3 = tl.philox(seed, c0, c1, z, z)
    u = _uniform(u0)
    u = tl.minimum(tl.maximum(u, 1e-10), 1.0 - 1e-7)
    return -tl.log(-tl.log(u))


@triton.jit
def block_max_kernel(logits_ptr, ws_ptr, V, NB, stride_lt, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    r = tl.program_id(0)
    b = tl.program_id(1)
    cols = b * BLOCK + tl.arange(0, BLOCK)
    m = cols < V
    x = tl.load(logits_ptr + r.to(tl.int64) * stride_lt + cols, mask=m, other=-float("inf")).to(tl.float32)
    mx = tl.max(x, axis=0)
    idx = tl.min(tl.where((x == mx) & m, cols, _BIG), axis=0)
    base = (r * NB + b) * 2
    tl.store(ws_ptr + base, mx)
    tl.store(ws_ptr + base + 1, idx.to(tl.float32))


@triton.jit
def threshold_kernel(logits_ptr, temp_ptr, top_k_ptr, top_p_ptr, ids_ptr, ws_ptr, row_ptr, V, NB, stride_lt,
                     BS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    r = tl.program_id(0)
    i = tl.arange(0, BS)
    mi = i < NB
    v = tl.load(ws_ptr + (r * NB + i) * 2, mask=mi, other=-float("inf"))
    idx = tl.load(ws_ptr + (r * NB + i) * 2 + 1, mask=mi, other=3.0e9)
    mx = tl.max(v, axis=0)
    best = tl.min(tl.where((v == mx) & mi, idx, 3.0e9), axis=0)
    temp = tl.load(temp_ptr + r)
    tau = tl.zeros((), tl.float32) - float("inf")
    if temp > 0:
        k = tl.load(top_k_ptr + r)
        p = tl.load(top_p_ptr + r)
        row = logits_ptr + r.to(tl.int64) * stride_lt
        xm = mx / temp  # = max(x): division by temp > 0 is monotone and correctly rounded
        hi0 = _key(xm).to(tl.int64)
        klo = (-2147483647 - 1) + tl.zeros((), tl.int64)
        if (k > 0) & (k < V):
            # tau_k = the smallest key t with count(key(x) > t) < k: the k-th largest x
            lo = klo
            hi = hi0
            for _ in range(32):
                mid = lo + (hi - lo) // 2
                cnt = tl.zeros((), tl.int32)
                for c0 in range(0, V, BLOCK):
                    cols = c0 + tl.arange(0, BLOCK)
                    mc = cols < V
                    x = tl.load(row + cols, mask=mc, other=-float("inf")).to(tl.float32) / temp
                    cnt += tl.sum((mc & (_key(x).to(tl.int64) > mid)).to(tl.int32), axis=0)
                pred = cnt < k
                hi = tl.where(pred, mid, hi)
                lo = tl.where(pred, lo, mid + 1)
            klo = lo
            tau = _unkey(lo.to(tl.int32))
        if p < 1.0:
            # mass of the top-k survivors, then the smallest key t with mass(key(x) > t) < p * z
            z = tl.zeros((), tl.float32)
            for c0 in range(0, V, BLOCK):
                cols = c0 + tl.arange(0, BLOCK)
                mc = cols < V
                x = tl.load(row + cols, mask=mc, other=-float("inf")).to(tl.float32) / temp
                keep = mc & (_key(x).to(tl.int64) >= klo)
                z += tl.sum(tl.where(keep, tl.exp(x - xm), 0.0), axis=0)
            goal = p * z
            lo = klo
            hi = hi0
            for _ in range(32):
                mid = lo + (hi - lo) // 2
                s = tl.zeros((), tl.float32)
                for c0 in range(0, V, BLOCK):
                    cols = c0 + tl.arange(0, BLOCK)
                    mc = cols < V
                    x = tl.load(row + cols, mask=mc, other=-float("inf")).to(tl.float32) / temp
                    kx = _key(x).to(tl.int64)
                    s += tl.sum(tl.where(mc & (kx >= klo) & (kx > mid), tl.exp(x - xm), 0.0), axis=0)
                pred = s < goal
                hi = tl.where(pred, mid, hi)
                lo = tl.where(pred, lo, mid + 1)
            tau = _unkey(lo.to(tl.int32))
    else:
        tl.store(ids_ptr + r, best.to(tl.int32))
    tl.store(row_ptr + r * 2, tau)
    tl.store(row_ptr + r * 2 + 1, best)


@triton.jit
def gumbel_block_kernel(logits_ptr, temp_ptr, seed_ptr, pos_ptr, ws_ptr, row_ptr, V, NB, stride_lt,
                        BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    r = tl.program_id(0)
    b = tl.program_id(1)
    temp = tl.load(temp_ptr + r)
    if temp > 0:
        tau = tl.load(row_ptr + r * 2)
        seed = row_seed(seed_ptr, r)
        pos = tl.load(pos_ptr + r).to(tl.uint32, bitcast=True)
        cols = b * BLOCK + tl.arange(0, BLOCK)
        m = cols < V
        x = tl.load(logits_ptr + r.to(tl.int64) * stride_lt + cols, mask=m, other=-float("inf")).to(tl.float32) / temp
        s = tl.where(m & (x >= tau), x + gumbel(seed, pos, cols), -float("inf"))
        mx = tl.max(s, axis=0)
        idx = tl.min(tl.where((s == mx) & m & (x >= tau), cols, _BIG), axis=0)
        base = (r * NB + b) * 2
        tl.store(ws_ptr + base, mx)
        tl.store(ws_ptr + base + 1, idx.to(tl.float32))


@triton.jit
def gumbel_final_kernel(temp_ptr, ws_ptr, row_ptr, ids_ptr, NB, BS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    r = tl.program_id(0)
    temp = tl.load(temp_ptr + r)
    if temp > 0:
        i = tl.arange(0, BS)
        mi = i < NB
        v = tl.load(ws_ptr + (r * NB + i) * 2, mask=mi, other=-float("inf"))
        idx = tl.load(ws_ptr + (r * NB + i) * 2 + 1, mask=mi, other=3.0e9)
        mx = tl.max(v, axis=0)
        best = tl.min(tl.where((v == mx) & mi, idx, 3.0e9), axis=0)
        best = tl.where(best < 3.0e9, best, tl.load(row_ptr + r * 2 + 1))  # no finite score: the argmax
        tl.store(ids_ptr + r, best.to(tl.int32))
