"""CPU path of the norm families (rmsnorm, head_rmsnorm, gated_rmsnorm): the launchers' arguments,
fp32 math, one rounding at the store into the preallocated output (inputs may be strided views)."""

from __future__ import annotations

import torch

__all__ = ["rmsnorm", "head_rmsnorm", "gated_rmsnorm"]


def _rms_scaled(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)


def rmsnorm(x, weight, out, eps: float = 1e-6, workspace=None, **params) -> None:
    """out[T, H] = x * rsqrt(mean(x^2) + eps) * (1 + weight[H])."""
    y = _rms_scaled(x, eps)
    y *= weight.float() + 1.0
    out.copy_(y)


def head_rmsnorm(x, weight, out, eps: float = 1e-6, workspace=None, **params) -> None:
    """out[T, heads, D] = per-head x * rsqrt(mean(x^2) + eps) * (1 + weight[D])."""
    rmsnorm(x, weight, out, eps)


def gated_rmsnorm(x, z, weight, out, eps: float = 1e-6, workspace=None, **params) -> None:
    """out[T, Hv*Dv] = RMSNorm(x[T, Hv, Dv]) * weight[Dv] * SiLU(z) per head (plain weight)."""
    y = _rms_scaled(x, eps)
    y *= weight.float()
    y *= torch.nn.functional.silu(z.float())
    out.view(x.shape).copy_(y)
