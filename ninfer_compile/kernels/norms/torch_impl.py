"""CPU path of the norm families (rmsnorm, head_rmsnorm, gated_rmsnorm): the launchers' arguments,
fp32 math (torch's fused rms_norm over the last axis), one rounding at the store into the
preallocated output (inputs may be strided views). The fp32 norm weight (1 + w for the
zero-centred norms) is made once per weight tensor (`torch_util.derived`). A few rows (decode) take
one fused C++ call where it builds (`torch_fused`), the same arithmetic."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..torch_util import derived
from .torch_fused import fused_rmsnorm

__all__ = ["rmsnorm", "head_rmsnorm", "gated_rmsnorm"]


def _one_plus(w: torch.Tensor) -> torch.Tensor:
    return derived(w, "norm_1p", lambda t: t.float() + 1.0)


def rmsnorm(x, weight, out, eps: float = 1e-6, workspace=None, **params) -> None:
    """out[T, H] = x * rsqrt(mean(x^2) + eps) * (1 + weight[H])."""
    w = _one_plus(weight)
    if not fused_rmsnorm(x, w, out, float(eps)):
        out.copy_(F.rms_norm(x.float(), (x.shape[-1],), w, float(eps)))


def head_rmsnorm(x, weight, out, eps: float = 1e-6, workspace=None, **params) -> None:
    """out[T, heads, D] = per-head x * rsqrt(mean(x^2) + eps) * (1 + weight[D])."""
    rmsnorm(x, weight, out, eps)


def gated_rmsnorm(x, z, weight, out, eps: float = 1e-6, workspace=None, **params) -> None:
    """out[T, Hv*Dv] = RMSNorm(x[T, Hv, Dv]) * weight[Dv] * SiLU(z) per head (plain weight)."""
    w = derived(weight, "norm_f32", lambda t: t.float())
    if fused_rmsnorm(x, w, out, float(eps), z=z):
        return
    y = F.rms_norm(x.float(), (x.shape[-1],), w, float(eps))
    y *= F.silu(z.float())
    out.view(x.shape).copy_(y)
