"""fp32 PyTorch references for the norm family.

All references compute in float32 and return float32; kernels are compared against them with a
bf16-sized tolerance.
"""

from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last axis.

    x: [T, H] (any float dtype), weight: [H]  ->  [T, H] float32 = x * rsqrt(mean(x^2) + eps) * (1 + w)
    """
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf * rstd * (1.0 + weight.float())


def head_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head zero-centred RMSNorm (the q/k norms).

    x: [T, heads, D], weight: [D]  ->  [T, heads, D] float32
    """
    return rmsnorm(x, weight, eps)


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN output norm: RMSNorm(x) * w * SiLU(z) per head (plain weight, no 1+w).

    x: [T, Hv, Dv], z: [T, Hv, Dv], weight: [Dv]  ->  [T, Hv * Dv] float32
    """
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * rstd * weight.float() * torch.nn.functional.silu(z.float())
    return y.reshape(x.shape[0], -1)
