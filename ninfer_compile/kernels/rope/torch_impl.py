"""CPU path of the RoPE families (rope, qk_norm_rope): partial NeoX RoPE over the first
`rotary_dim` dims of each head, optionally after the zero-centred head RMSNorm; fp32 math, one
rounding at the store; outputs may alias the inputs (the whole input is read first)."""

from __future__ import annotations

import math

import torch

__all__ = ["rope", "qk_norm_rope"]

_INV_FREQ: dict[tuple[int, float], torch.Tensor] = {}


def _inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    key = (int(rotary_dim), float(theta))
    f = _INV_FREQ.get(key)
    if f is None:  # the kernels' exp2(-(2i/r) log2 theta)
        i = torch.arange(rotary_dim // 2, dtype=torch.float32)
        f = _INV_FREQ[key] = torch.exp2(-(2.0 * i / rotary_dim) * math.log2(theta))
    return f


def _cos_sin(positions, rotary_dim: int, theta: float):
    ang = positions.float()[:, None] * _inv_freq(rotary_dim, theta)  # [T, half]
    return ang.cos()[:, None, :], ang.sin()[:, None, :]


def _rotate(xf: torch.Tensor, cos, sin, rotary_dim: int) -> torch.Tensor:
    """fp32 [T, heads, D] rotated (a new tensor unless rotary_dim == D, where xf is reused)."""
    half = rotary_dim // 2
    x1, x2 = xf[..., :half], xf[..., half:rotary_dim]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if rotary_dim == xf.shape[-1]:
        return torch.cat((y1, y2), dim=-1)
    return torch.cat((y1, y2, xf[..., rotary_dim:]), dim=-1)


def rope(x, positions, out, rotary_dim: int, theta: float, workspace=None, **params) -> None:
    """out[T, heads, D] = partial NeoX RoPE of x at positions[T]; out may alias x."""
    cos, sin = _cos_sin(positions, rotary_dim, theta)
    out.copy_(_rotate(x.float(), cos, sin, rotary_dim))


def _head_norm(x, weight, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * (weight.float() + 1.0)


def qk_norm_rope(q, k, q_weight, k_weight, positions, q_out, k_out, eps: float, rotary_dim: int,
                 theta: float, workspace=None, **params) -> None:
    """Head RMSNorm (1 + w) then partial RoPE of q [T, Hq, D] and k [T, Hk, D] (outputs may alias)."""
    cos, sin = _cos_sin(positions, rotary_dim, theta)
    qr = _rotate(_head_norm(q, q_weight, eps), cos, sin, rotary_dim)
    kr = _rotate(_head_norm(k, k_weight, eps), cos, sin, rotary_dim)
    q_out.copy_(qr)
    k_out.copy_(kr)
