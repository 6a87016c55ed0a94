"""Launchers of the RoPE family (preallocated outputs, no allocation, return None)."""

from __future__ import annotations

import math

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import qk_norm_rope_kernel, rope_kernel
from ..pdl import pdl_launch


def _check(name: str, x: torch.Tensor, rotary_dim: int) -> None:
    D = x.shape[-1]
    if rotary_dim % 2 or not 0 < rotary_dim <= D:
        raise RouteError(f"{name}: rotary_dim {rotary_dim} must be even and in (0, {D}]")
    if x.stride(-1) != 1:
        raise RouteError(f"{name}: last axis must be contiguous")


def rope(
    x: torch.Tensor, positions: torch.Tensor, out: torch.Tensor, rotary_dim: int, theta: float
) -> None:
    """out[T, heads, D] = partial NeoX RoPE of x[T, heads, D] at positions[T] (int32). out may alias x."""
    T, heads, D = x.shape
    _check("rope", x, rotary_dim)
    _check("rope", out, rotary_dim)
    if out.shape != x.shape or positions.shape != (T,):
        raise RouteError(f"rope: shapes x{tuple(x.shape)} out{tuple(out.shape)} positions{tuple(positions.shape)}")
    block = triton.next_power_of_2(D)
    rope_kernel[(T * heads,)](
        x, out, positions, heads, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        D, math.log2(theta), ROT=rotary_dim, BLOCK=block, num_warps=1 if block <= 128 else 2,
        **pdl_launch(rope_kernel),
    )


def qk_norm_rope(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
    positions: torch.Tensor, q_out: torch.Tensor, k_out: torch.Tensor,
    eps: float, rotary_dim: int, theta: float,
) -> None:
    """Fused head RMSNorm (1+w) + partial RoPE of q[T,Hq,D] and k[T,Hk,D] in one launch.

    Outputs q_out[T,Hq,D], k_out[T,Hk,D] (may alias q / k). Inputs may be strided views.
    """
    T, hq, D = q.shape
    _, hk, Dk = k.shape
    for t in (q, k, q_out, k_out):
        _check("qk_norm_rope", t, rotary_dim)
    if Dk != D or k.shape[0] != T or q_out.shape != q.shape or k_out.shape != k.shape or positions.shape != (T,):
        raise RouteError(f"qk_norm_rope: shapes q{tuple(q.shape)} k{tuple(k.shape)} positions{tuple(positions.shape)}")
    block = triton.next_power_of_2(D)
    qk_norm_rope_kernel[(T * (hq + hk),)](
        q, k, q_weight, k_weight, q_out, k_out, positions, hq, hk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        D, math.log2(theta), eps, ROT=rotary_dim, BLOCK=block, num_warps=1 if block <= 128 else 2,
        **pdl_launch(qk_norm_rope_kernel),
    )
