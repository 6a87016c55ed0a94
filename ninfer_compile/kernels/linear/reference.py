"""Plain fp32 PyTorch reference for the linear family.

`linear(x[T,K], weight: QuantWeight | bf16[N,K]; epilogue, residual[T,N_out]?) -> out[T,N_out]` fp32:
- `none`:     out = x @ W_hat.T                              (N_out = N)
- `swiglu`:   rows of W are [gate | up]; out = silu(x @ G.T) * (x @ U.T)   (N_out = N / 2)
- `residual`: out = residual + x @ W_hat.T                   (N_out = N)
W_hat is the exact binary32 oracle of tensor-formats §6.2: scale32 × code32 (no bf16 anywhere).
"""

from __future__ import annotations

import torch

from .weights import FORMAT_BITS, QuantWeight

__all__ = ["decode_planes", "dequantize", "linear"]


def decode_planes(w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed codes int32 [N, K] and fp16 scales [N, groups_per_row] decoded from the planes
    (independent of the Triton unpack; runs on any device)."""
    bits = FORMAT_BITS[w.format]
    n, kp = w.n, w.k_pad
    base = w.base.view(n, -1).to(torch.int32)
    if bits == 8:
        u = base
    else:
        u = torch.stack([base & 0xF, base >> 4], dim=-1).reshape(n, kp)
        if bits > 4:
            hb = bits - 4
            hi = w.high.view(n, -1).to(torch.int32)
            bitpos = torch.arange(8, device=hi.device)
            stream = ((hi[:, :, None] >> bitpos) & 1).reshape(n, -1)  # lane-major bit stream
            stream = stream.reshape(n, kp, hb)
            for b in range(hb):
                u = u | (stream[:, :, b] << (4 + b))
    half = 1 << (bits - 1)
    q = torch.where(u >= half, u - (1 << bits), u)
    scales = w.scale.view(torch.float16).view(n, w.groups_per_row)
    return q[:, : w.k], scales


def dequantize(weight) -> torch.Tensor:
    """fp32 [N, K]: exact scale32 × code32 for a QuantWeight; bf16 weights are upcast."""
    if isinstance(weight, torch.Tensor):
        return weight.float()
    q, s = decode_planes(weight)
    g = weight.group
    s32 = s.float().repeat_interleave(g, dim=1)[:, : weight.k]
    return s32 * q.float()


def linear(x: torch.Tensor, weight, epilogue: str = "none", residual: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 reference; x [T, K] any float dtype. Returns fp32 [T, N_out]."""
    w = dequantize(weight).to(x.device)
    acc = x.float() @ w.T
    if epilogue == "none":
        return acc
    if epilogue == "residual":
        if residual is None:
            raise ValueError("residual epilogue needs a residual tensor")
        return residual.float() + acc
    if epilogue == "swiglu":
        n_out = acc.shape[1] // 2
        gate, up = acc[:, :n_out], acc[:, n_out:]
        return torch.nn.functional.silu(gate) * up
    raise ValueError(f"unknown epilogue {epilogue!r}")
