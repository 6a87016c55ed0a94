"""Launchers of the conv1d family (preallocated outputs, no allocation, return None).

conv1d_decode: every column is its own slot (C concurrent sequences, one column each); output and
state roll in one kernel. conv1d_prefill: any T; columns of a slot form one contiguous run with
consecutive positions (several sequences may share a launch); two kernels (output, then state).
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import conv1d_kernel, conv1d_state_kernel
from ..pdl import pdl_launch

DECODE_MAX_T = 64
BLOCK_C = 256


def _check(name, x, weight, conv_state, out, positions, slots):
    T, C = x.shape
    K = weight.shape[0]
    if weight.shape != (K, C) or conv_state.shape[1:] != (K - 1, C) or out.shape != (T, C):
        raise RouteError(
            f"{name}: shapes x{tuple(x.shape)} weight{tuple(weight.shape)} "
            f"conv_state{tuple(conv_state.shape)} out{tuple(out.shape)}"
        )
    if K < 2:
        raise RouteError(f"{name}: kernel width {K} must be >= 2")
    if positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"{name}: positions/slots must be [T={T}] int32")
    for n, t in (("x", x), ("out", out), ("weight", weight), ("conv_state", conv_state)):
        if t.stride(-1) != 1:
            raise RouteError(f"{name}: operand {n} must have a contiguous last axis")
    if weight.stride(0) != C:
        raise RouteError(f"{name}: weight must be contiguous [K, C]")
    return T, C, K


def conv1d_decode(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
    positions: torch.Tensor, slots: torch.Tensor, out: torch.Tensor,
) -> None:
    """x[T,C] (T distinct slots), weight[K,C], conv_state[slots,K-1,C] (rolled in place) -> out[T,C]."""
    T, C, K = _check("conv1d_decode", x, weight, conv_state, out, positions, slots)
    if not 1 <= T <= DECODE_MAX_T:
        raise RouteError(f"conv1d_decode: T={T} outside the route domain [1, {DECODE_MAX_T}]")
    grid = (T, triton.cdiv(C, BLOCK_C))
    conv1d_kernel[grid](
        x, weight, conv_state, out, positions, slots,
        C, x.stride(0), out.stride(0), conv_state.stride(0), conv_state.stride(1),
        K=K, KP=triton.next_power_of_2(K), BLOCK_C=BLOCK_C, FUSE_STATE=True, num_warps=2,
        **pdl_launch(conv1d_kernel),
    )


def conv1d_prefill(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
    positions: torch.Tensor, slots: torch.Tensor, out: torch.Tensor,
) -> None:
    """x[T,C] (contiguous per-slot runs), weight[K,C], conv_state[slots,K-1,C] (updated) -> out[T,C]."""
    T, C, K = _check("conv1d_prefill", x, weight, conv_state, out, positions, slots)
    grid = (T, triton.cdiv(C, BLOCK_C))
    kp = triton.next_power_of_2(K)
    conv1d_kernel[grid](
        x, weight, conv_state, out, positions, slots,
        C, x.stride(0), out.stride(0), conv_state.stride(0), conv_state.stride(1),
        K=K, KP=kp, BLOCK_C=BLOCK_C, FUSE_STATE=False, num_warps=2,
        **pdl_launch(conv1d_kernel),
    )
    conv1d_state_kernel[grid](
        x, conv_state, positions, slots, T, C, x.stride(0), conv_state.stride(0), conv_state.stride(1),
        K=K, KP=kp, BLOCK_C=BLOCK_C, num_warps=2,
        **pdl_launch(conv1d_state_kernel),
    )
