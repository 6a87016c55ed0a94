"""Shared epilogue / split-K helpers for the linear kernels.

EPI codes (constexpr): 0 = none, 1 = swiglu (gate rows [0, N_OUT), up rows [N_OUT, 2 N_OUT);
out = silu(gate) * up), 2 = residual (out = residual + acc). Index tensors are broadcastable, so
the same helpers serve [T, N] (GEMV) and [N, T] (tensor-core) accumulator orientations.

Split-K is deterministic two-phase: each split stores fp32 partials into the caller's workspace
`ws[SPLIT_K, T, WS_COLS]` (WS_COLS = 2 N_OUT for swiglu: gate then up), and
`splitk_reduce_kernel` sums them in split order and applies the epilogue.

The decode GEMVs (gemv_lowreg, gemv_tc) can do the second phase in the same launch instead
(`splitk_fixup`, route param REDUCE=fused): every split of an output tile stores its partials,
fences, and takes a ticket from the tile's arrival counter; the split that arrives last sums the
SPLIT_K partials of the tile in split order (so the result does not depend on arrival order: it is
bit-identical to the two-launch reduce) and writes the epilogue, then resets the counter. The
counters (`fixup_counters(device)`: FIXUP_COUNTERS int32, zero when allocated and again after every
launch) are one buffer per device and process, allocated on a launcher's first fused call (the
runtime's eager warm-up, before any CUDA-graph capture): the per-extent workspace cannot hold them,
as other families' scratch (split-KV attention) overwrites it between launches. One engine per
device and process at a time (launches on one stream): two streams sharing the counters would race.
"""

from __future__ import annotations

import triton
import triton.language as tl
from ..pdl import pdl_enter

EPI_CODES = {"none": 0, "swiglu": 1, "residual": 2}

# int32 arrival counters of the fused split-K reduce: one per output tile of a launch (a tile = the
# rows one program owns; the 27B output head at 16 rows per program is 15,520 tiles)
FIXUP_COUNTERS = 16384
_COUNTERS: dict = {}


def fixup_counters(like):
    """The zeroed int32 [FIXUP_COUNTERS] arrival counters on `like`'s device (one buffer per device,
    cached; a tensor subclass -- the ahead-of-time compiler's fake device tensors -- gets its own)."""
    import torch

    if type(like) is not torch.Tensor:
        return torch.zeros(FIXUP_COUNTERS, dtype=torch.int32, device=like.device)
    key = str(like.device)
    buf = _COUNTERS.get(key)
    if buf is None:
        buf = _COUNTERS[key] = torch.zeros(FIXUP_COUNTERS, dtype=torch.int32, device=like.device)
    return buf


@triton.jit
def store_epilogue(g, u, t_idx, n_idx, mask, out_ptr, res_ptr, so, sr, EPI: tl.constexpr,
                   INTERP: tl.constexpr = False):
    if EPI == 1:
        val = g / (1.0 + tl.exp(-g)) * u
    elif EPI == 2:
        r = tl.load(res_ptr + t_idx * sr + n_idx, mask=mask, other=0.0).to(tl.float32)
        val = g + r
    else:
        val = g
    if INTERP:  # the interpreter truncates fp32 -> bf16: round to nearest even on the bits first
        b = val.to(tl.uint32, bitcast=True)
        val = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    tl.store(out_ptr + t_idx * so + n_idx, val.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_partial(g, u, t_idx, n_idx, mask, ws_ptr, pid_k, T, N_OUT, EPI: tl.constexpr):
    if EPI == 1:
        ws_cols = 2 * N_OUT
    else:
        ws_cols = N_OUT
    p = ws_ptr + pid_k * T * ws_cols + t_idx * ws_cols + n_idx
    tl.store(p, g, mask=mask)
    if EPI == 1:
        tl.store(p + N_OUT, u, mask=mask)


@triton.jit
def splitk_reduce_kernel(ws_ptr, out_ptr, res_ptr, T, N_OUT, so, sr,
                         SPLIT_K: tl.constexpr, EPI: tl.constexpr, BLOCK: tl.constexpr,
                         INTERP: tl.constexpr = False, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    m = idx < T * N_OUT
    t = idx // N_OUT
    n = idx % N_OUT
    if EPI == 1:
        ws_cols = 2 * N_OUT
    else:
        ws_cols = N_OUT
    g = tl.zeros([BLOCK], tl.float32)
    u = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        p = ws_ptr + s * T * ws_cols + t * ws_cols + n
        g += tl.load(p, mask=m, other=0.0)
        if EPI == 1:
            u += tl.load(p + N_OUT, mask=m, other=0.0)
    store_epilogue(g, u, t, n, m, out_ptr, res_ptr, so, sr, EPI, INTERP)


@triton.jit
def fence_gpu(anchor, INTERP: tl.constexpr):
    """fence.acq_rel.gpu once per element of `anchor` that a thread holds; nothing under the
    interpreter (programs run one after another there). The asm is emitted per element: pass a 1-D
    anchor (up to the program's thread count it is replicated, so every thread holds one element and
    fences once; a longer one gives each thread length / threads). A [BLOCK_N, BLOCK_T] anchor made each thread fence 8-16 times in a
    row, and each fence waits for the thread's outstanding stores: the 2026-12-01 H200 run measured
    the fused reduce 20-50% slower than a second launch with that anchor."""
    if not INTERP:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [anchor], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def splitk_fixup(ws_ptr, cnt_ptr, out_ptr, res_ptr, tile, n0, T, N_OUT, so, sr,
                 SPLIT_K: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                 INTERP: tl.constexpr):
    """Second phase of a split-K launch inside the launch (call after this program stored its
    partials for rows [n0, n0 + BLOCK_N) x every column): the last of the tile's SPLIT_K programs
    to arrive sums the tile's partials in split order, applies the epilogue, resets the counter."""
    n = n0 + tl.arange(0, BLOCK_N)[:, None]
    t = tl.arange(0, BLOCK_T)[None, :]
    m = (n < N_OUT) & (t < T)
    one_per_thread = n0 + tl.arange(0, BLOCK_N)  # gemv_tc: 16 x NW rows over 32 x NW threads
    fence_gpu(one_per_thread, INTERP)  # this thread's partial stores are visible device-wide ...
    tl.debug_barrier()  # ... for every thread of the program, before the ticket is taken
    ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT_K - 1:
        fence_gpu(one_per_thread, INTERP)
        if EPI == 1:
            ws_cols = 2 * N_OUT
        else:
            ws_cols = N_OUT
        g = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
        u = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
        for s in tl.static_range(SPLIT_K):
            p = ws_ptr + s * T * ws_cols + t * ws_cols + n
            g += tl.load(p, mask=m, other=0.0, cache_modifier=".cg")
            if EPI == 1:
                u += tl.load(p + N_OUT, mask=m, other=0.0, cache_modifier=".cg")
        store_epilogue(g, u, t, n, m, out_ptr, res_ptr, so, sr, EPI, INTERP)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
