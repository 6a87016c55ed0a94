"""fp32 PyTorch references for partial NeoX RoPE (and the fused q/k norm + RoPE).

NeoX ("rotate_half") convention over the first `rotary_dim` dims of each head: with r = rotary_dim,
half = r/2, inv_freq[i] = theta^(-2i/r) (i < half), angle = position * inv_freq[i]:
    out[i]        = x[i] * cos - x[i + half] * sin
    out[i + half] = x[i + half] * cos + x[i] * sin
Dims r..D-1 pass through untouched. Text-only Qwen3.5 positions are scalar, so the model's MRoPE
reduces to this plain RoPE.
"""

from __future__ import annotations

import torch

from ..norms.reference import head_rmsnorm


def inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    """[rotary_dim/2] float32 inverse frequencies (the HF formula)."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))


def rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """x: [T, heads, D], positions: [T] int  ->  [T, heads, D] float32."""
    xf = x.float()
    half = rotary_dim // 2
    ang = positions.float()[:, None] * inv_freq(rotary_dim, theta)[None, :]  # [T, half]
    cos = ang.cos()[:, None, :]
    sin = ang.sin()[:, None, :]
    x1 = xf[..., :half]
    x2 = xf[..., half:rotary_dim]
    out = xf.clone()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rotary_dim] = x2 * cos + x1 * sin
    return out


def qk_norm_rope(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
    positions: torch.Tensor, eps: float, rotary_dim: int, theta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-centred head RMSNorm then partial RoPE for q [T,Hq,D] and k [T,Hk,D] -> fp32 (q, k)."""
    qn = head_rmsnorm(q, q_weight, eps)
    kn = head_rmsnorm(k, k_weight, eps)
    return rope(qn, positions, rotary_dim, theta), rope(kn, positions, rotary_dim, theta)
