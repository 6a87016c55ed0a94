"""Launchers of the norm family.

Every output is preallocated by the caller; launchers allocate nothing and return None.
Inputs may be strided views (last axis contiguous); outputs must have a contiguous last axis.
"""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import gated_rmsnorm_kernel, rmsnorm_rows_kernel
from ..pdl import pdl_launch


def _check_last_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise RouteError(f"norms: operand {name} must have a contiguous last axis (stride {t.stride(-1)})")


def _num_warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6,
            num_warps="auto") -> None:
    """out[T, H] = x[T, H] * rsqrt(mean(x^2) + eps) * (1 + weight[H]). bf16 in/out, fp32 math.
    num_warps: "auto" (by the block size) or 1 / 2 / 4 / 8 / 16 (route param)."""
    T, H = x.shape
    for n, t in (("x", x), ("out", out)):
        _check_last_contiguous(n, t)
    if out.shape != (T, H) or weight.shape != (H,):
        raise RouteError(f"rmsnorm: shapes x{tuple(x.shape)} weight{tuple(weight.shape)} out{tuple(out.shape)}")
    block = triton.next_power_of_2(H)
    if num_warps != "auto" and num_warps not in (1, 2, 4, 8, 16):
        raise RouteError(f"rmsnorm: num_warps must be auto, 1, 2, 4, 8 or 16, got {num_warps!r}")
    rmsnorm_rows_kernel[(T,)](
        x, weight, out, 1, x.stride(0), 0, out.stride(0), 0, H, eps,
        MODE=0, BLOCK=block, num_warps=_num_warps(block) if num_warps == "auto" else int(num_warps),
        **pdl_launch(rmsnorm_rows_kernel),
    )


def head_rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6) -> None:
    """out[T, heads, D] = per-head x * rsqrt(mean(x^2) + eps) * (1 + weight[D]). x may be strided."""
    T, heads, D = x.shape
    for n, t in (("x", x), ("out", out)):
        _check_last_contiguous(n, t)
    if out.shape != (T, heads, D) or weight.shape != (D,):
        raise RouteError(f"head_rmsnorm: shapes x{tuple(x.shape)} weight{tuple(weight.shape)} out{tuple(out.shape)}")
    block = triton.next_power_of_2(D)
    rmsnorm_rows_kernel[(T * heads,)](
        x, weight, out, heads, x.stride(0), x.stride(1), out.stride(0), out.stride(1), D, eps,
        MODE=0, BLOCK=block, num_warps=_num_warps(block),
        **pdl_launch(rmsnorm_rows_kernel),
    )


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6
) -> None:
    """out[T, Hv*Dv] = RMSNorm(x[T,Hv,Dv]) * weight[Dv] * SiLU(z[T,Hv,Dv]) per head (no 1+w)."""
    T, heads, D = x.shape
    for n, t in (("x", x), ("z", z), ("out", out)):
        _check_last_contiguous(n, t)
    if z.shape != x.shape or out.shape != (T, heads * D) or weight.shape != (D,):
        raise RouteError(
            f"gated_rmsnorm: shapes x{tuple(x.shape)} z{tuple(z.shape)} weight{tuple(weight.shape)} "
            f"out{tuple(out.shape)}"
        )
    block = triton.next_power_of_2(D)
    gated_rmsnorm_kernel[(T * heads,)](
        x, z, weight, out, heads, x.stride(0), x.stride(1), z.stride(0), z.stride(1), out.stride(0),
        D, eps, BLOCK=block, num_warps=_num_warps(block),
        **pdl_launch(gated_rmsnorm_kernel),
    )
