"""Launcher of `l2_prefetch`.

    l2_prefetch(after, weight, *, BYTES=1<<24, PIECE=1<<20, FOLD=False)
    folded_prefetch_args(weight, nbytes, lanes)   # for kernels that carry a folded prefetch

`weight`: a `QuantWeight` (row-split planes, maybe a row view) or a 2-D tensor (bf16 rows). The
first rows of every plane, as many as BYTES covers in all (`prefetch_spans`), go to L2. Launched
only on a CUDA device of sm_90 or newer outside the interpreter (the bulk prefetch is an sm_90
instruction); elsewhere the hint is dropped (it has no value to compute). `after` is not read.
"""

from __future__ import annotations

import torch
import triton

from ...errors import RouteError
from ..interpret import interpreting
from ..pdl import pdl_launch
from .kernels import l2_prefetch_kernel

ALIGN = 16  # the bulk prefetch's address and size granule


def prefetch_spans(weight, nbytes: int) -> list[tuple[int, int]]:
    """[(address, bytes)] x 3 of the first rows of `weight`'s planes, as many rows as `nbytes`
    covers over all planes (at least one, at most all), each span shrunk to 16-byte boundaries.
    An absent or empty plane is (the first span's address, 0)."""
    if nbytes < 1:
        raise RouteError(f"l2_prefetch: BYTES must be >= 1, got {nbytes}")
    if hasattr(weight, "base_row_bytes"):  # QuantWeight
        planes = [(weight.base, weight.base_row_bytes), (weight.high, weight.high_row_bytes),
                  (weight.scale, weight.scale_row_bytes)]
        n_rows = int(weight.n)
        spans = []
        per_row = sum(b for _, b in planes)
        rows = max(1, min(n_rows, -(-nbytes // per_row)))
        for t, row_bytes in planes:
            spans.append((0, 0) if t is None or row_bytes == 0 else (int(t.data_ptr()), rows * row_bytes))
    elif isinstance(weight, torch.Tensor) and weight.dim() == 2:
        es = weight.element_size()
        per_row = int(weight.stride(0)) * es
        rows = max(1, min(int(weight.shape[0]), -(-nbytes // per_row)))
        spans = [(int(weight.data_ptr()), (rows - 1) * per_row + int(weight.shape[1]) * es), (0, 0), (0, 0)]
    else:
        raise RouteError(f"l2_prefetch: weight must be a QuantWeight or a 2-D tensor, got {type(weight).__name__}")
    out = []
    for addr, n in spans:
        lo = -(-addr // ALIGN) * ALIGN
        hi = (addr + n) // ALIGN * ALIGN
        out.append((lo, hi - lo) if n and hi > lo else (None, 0))
    first = next((a for a, _ in out if a is not None), 0)
    return [(first if a is None else a, n) for a, n in out]  # an empty span keeps a real address: one signature


def folded_prefetch_args(weight, nbytes: int, lanes: int) -> tuple[tuple[int, ...], bool]:
    """For a kernel that carries a folded prefetch (one program's `lanes` threads issue it): the
    kernel arguments (a0, n0, a1, n1, a2, n2, sub) and whether to issue at all (an sm_90+ CUDA
    device outside the interpreter; else zeros and False: the hint is dropped)."""
    if weight is None or nbytes is None or not issues_on(_device(weight)):
        return (0, 0, 0, 0, 0, 0, ALIGN), False
    spans = prefetch_spans(weight, int(nbytes))
    total = sum(n for _, n in spans)
    sub = max(ALIGN, -(-total // lanes // ALIGN) * ALIGN)
    return (*[v for s in spans for v in s], sub), total > 0


def issues_on(dev: torch.device) -> bool:
    """The bulk L2 prefetch can be issued: a CUDA device of sm_90+, not the interpreter."""
    return not interpreting() and dev.type == "cuda" and torch.cuda.get_device_capability(dev) >= (9, 0)


def _device(weight) -> torch.device:
    return weight.device if isinstance(weight, torch.Tensor) else weight.base.device


def l2_prefetch(after, weight, BYTES: int = 1 << 24, PIECE: int = 1 << 20, FOLD: bool = False) -> None:
    """FOLD is the pass's (a site it could not fold launches here all the same)."""
    if PIECE % (32 * ALIGN) or PIECE < 32 * ALIGN:
        raise RouteError(f"l2_prefetch: PIECE must be a multiple of {32 * ALIGN}, got {PIECE}")
    spans = prefetch_spans(weight, int(BYTES))
    if not issues_on(_device(weight)):
        return
    total = sum(n for _, n in spans)
    if total == 0:
        return
    (a0, n0), (a1, n1), (a2, n2) = spans
    l2_prefetch_kernel[(triton.cdiv(total, PIECE),)](a0, n0, a1, n1, a2, n2, PIECE=PIECE, num_warps=1,
                                                    **pdl_launch(l2_prefetch_kernel))
