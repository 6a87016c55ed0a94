"""Launcher of `state_select` (preallocated operands, no allocation, returns None; CUDA-graph safe:
the accepted counts are read on the device).

state_select(state [slots, *S], columns [C, K, *S] (same dtype), accepted [C] int32, slots [C*(K+1)]
int32): state[slots[r*(K+1)]] = columns[r, accepted[r]] where 0 <= accepted[r] < K, else untouched.
Each slot's *S block and each columns[r, j] block must be contiguous (flattened to N elements).
slots may cover fewer rows than columns / accepted hold (slots.numel() // (K+1) rows run).
"""

from __future__ import annotations

import math

import triton

from ninfer_compile.errors import RouteError

from .kernels import state_select_kernel
from ..pdl import pdl_launch


def _contiguous_tail(t, start: int) -> bool:
    """The axes from `start` on are one contiguous block (row-major)."""
    step = 1
    for n, st in zip(reversed(t.shape[start:]), reversed(t.stride()[start:])):
        if n != 1 and st != step:
            return False
        step *= n
    return True


def state_select(state, columns, accepted, slots, BLOCK: int = 1024, num_warps: int = 4) -> None:
    """One launch, grid (C, cdiv(N, BLOCK)); a row whose accepted >= K (all drafts kept) exits at once."""
    name = "state_select"
    if state.dim() < 2 or columns.dim() != state.dim() + 1 or tuple(columns.shape[2:]) != tuple(state.shape[1:]):
        raise RouteError(f"{name}: columns{tuple(columns.shape)} must be [C, K, *S] for state{tuple(state.shape)}")
    K = columns.shape[1]
    if columns.dtype != state.dtype:
        raise RouteError(f"{name}: columns dtype {columns.dtype} != state dtype {state.dtype}")
    # rows run: slots has C*(K+1) entries (the runtime may narrow it to the first rows; columns and
    # accepted keep their C)
    C = slots.shape[0] // (K + 1) if slots.dim() == 1 else 0
    if slots.dim() != 1 or slots.shape[0] != C * (K + 1) or C > columns.shape[0] or accepted.dim() != 1 \
            or accepted.shape[0] < C or not accepted.is_contiguous() or not slots.is_contiguous():
        raise RouteError(f"{name}: accepted{tuple(accepted.shape)} / slots{tuple(slots.shape)} must be contiguous "
                         f"[C={columns.shape[0]}] and [C*(K+1)={columns.shape[0] * (K + 1)}] (or fewer whole rows)")
    if not (_contiguous_tail(state, 1) and _contiguous_tail(columns, 2)):
        raise RouteError(f"{name}: each slot of state and each columns[r, j] must be one contiguous block")
    if K < 1 or C < 1:
        raise RouteError(f"{name}: columns{tuple(columns.shape)} needs C >= 1 rows and K >= 1 columns")
    n = math.prod(state.shape[1:])
    grid = (C, triton.cdiv(n, BLOCK))
    state_select_kernel[grid](
        state, columns, accepted, slots, n, K, state.stride(0), columns.stride(0), columns.stride(1),
        BLOCK=BLOCK, num_warps=num_warps, **pdl_launch(state_select_kernel),
    )
