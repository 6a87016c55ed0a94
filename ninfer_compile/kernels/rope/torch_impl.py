"""CPU path of the RoPE families (rope, qk_norm_rope): partial NeoX RoPE over the first
`rotary_dim` dims of each head, optionally after the zero-centred head RMSNorm; fp32 math, one
rounding at the store; outputs may alias the inputs (the whole input is read first). The rotation
is done in place on an fp32 copy: dims [0, r/2) and [r/2, r) are updated from the old values.
qk_norm_rope's few columns (decode) take one fused C++ call where it builds (`torch_fused`), the
same arithmetic."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..torch_util import derived
from .torch_fused import fused_qk_norm_rope

__all__ = ["rope", "qk_norm_rope"]

_INV_FREQ: dict[tuple[int, float], torch.Tensor] = {}


def _inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    key = (int(rotary_dim), float(theta))
    f = _INV_FREQ.get(key)
    if f is None:  # the kernels' exp2(-(2i/r) log2 theta)
        i = torch.arange(rotary_dim // 2, dtype=torch.float32)
        f = _INV_FREQ[key] = torch.exp2(-(2.0 * i / rotary_dim) * math.log2(theta))
    return f


def _rotate_(xf: torch.Tensor, positions, rotary_dim: int, theta: float) -> torch.Tensor:
    """Rotate fp32 xf [T, heads, D] in place (returns it)."""
    half = rotary_dim // 2
    ang = positions.float()[:, None] * _inv_freq(rotary_dim, theta)  # [T, half]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = xf[..., :half], xf[..., half:rotary_dim]
    y1 = x1 * cos - x2 * sin
    x2.mul_(cos).addcmul_(x1, sin)
    x1.copy_(y1)
    return xf


def rope(x, positions, out, rotary_dim: int, theta: float, workspace=None, **params) -> None:
    """out[T, heads, D] = partial NeoX RoPE of x at positions[T]; out may alias x."""
    out.copy_(_rotate_(x.float(), positions, rotary_dim, theta))


def qk_norm_rope(q, k, q_weight, k_weight, positions, q_out, k_out, eps: float, rotary_dim: int,
                 theta: float, workspace=None, **params) -> None:
    """Head RMSNorm (1 + w) then partial RoPE of q [T, Hq, D] and k [T, Hk, D] (outputs may alias);
    q and k heads are normalised and rotated together."""
    hq, D = q.shape[1], q.shape[2]
    qw = derived(q_weight, "norm_1p", lambda t: t.float() + 1.0)
    kw = derived(k_weight, "norm_1p", lambda t: t.float() + 1.0)
    if fused_qk_norm_rope(q, k, qw, kw, positions, _inv_freq(rotary_dim, theta), q_out, k_out, float(eps),
                          int(rotary_dim)):
        return
    xf = torch.cat((q, k), dim=1).float()
    if qw is kw:
        y = F.rms_norm(xf, (D,), qw, float(eps))
    else:
        y = F.rms_norm(xf, (D,), None, float(eps))
        y[:, :hq] *= qw
        y[:, hq:] *= kw
    _rotate_(y, positions, rotary_dim, theta)
    q_out.copy_(y[:, :hq])
    k_out.copy_(y[:, hq:])
