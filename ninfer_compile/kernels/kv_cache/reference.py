"""fp32 PyTorch references of the KV-cache append and the int8-g64 cache codec.

Cache layout: k_cache, v_cache [slots, max_ctx, Hkv, D] (bf16 or int8); for int8 also
k_scale, v_scale [slots, max_ctx, Hkv, D/64] float16.

INT8-G64 codec (symmetric, per token, per KV head, per 64 consecutive values of D):
    amax  = max |x| over the group (x: the bf16 value in fp32)
    scale = fp16(amax / 127)                     (round-to-nearest-even into binary16)
    code  = clamp(round_half_away(x / scale), -127, 127)   (code 0 for the whole group when scale == 0)
    x'    = float(scale) * code
"""

from __future__ import annotations

import torch

GROUP = 64


def quantize_g64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (D % 64 == 0) -> (codes int8 [..., D], scales float16 [..., D/64])."""
    xf = x.float()
    g = xf.reshape(*xf.shape[:-1], -1, GROUP)
    scale = (g.abs().amax(-1) / 127.0).to(torch.float16)  # [..., D/64]
    s = scale.float()[..., None]
    y = torch.where(s > 0, g / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(g))
    code = (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-127, 127)
    return code.to(torch.int8).reshape(xf.shape), scale


def dequantize_g64(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes int8 [..., D], scales f16 [..., D/64] -> float32 [..., D]."""
    c = codes.float().reshape(*codes.shape[:-1], -1, GROUP)
    return (c * scales.float()[..., None]).reshape(codes.shape)


def kv_append(k, v, positions, slots, k_cache, v_cache, k_scale=None, v_scale=None):
    """Write column t's k[t], v[t] ([T, Hkv, D]) at cache[slots[t], positions[t]].

    Returns new (k_cache, v_cache, k_scale, v_scale) copies (scales None for a bf16 cache).
    """
    kc, vc = k_cache.clone(), v_cache.clone()
    ks = None if k_scale is None else k_scale.clone()
    vs = None if v_scale is None else v_scale.clone()
    for t in range(k.shape[0]):
        s, p = int(slots[t]), int(positions[t])
        if kc.dtype == torch.int8:
            kc[s, p], ks[s, p] = quantize_g64(k[t])
            vc[s, p], vs[s, p] = quantize_g64(v[t])
        else:
            kc[s, p] = k[t].to(kc.dtype)
            vc[s, p] = v[t].to(vc.dtype)
    return kc, vc, ks, vs


def cache_as_float(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """[slots, ctx, Hkv, D] cache (bf16, or int8 + scales) -> float32 values."""
    return cache.float() if scale is None else dequantize_g64(cache, scale)
