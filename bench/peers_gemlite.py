"""gemlite (a Triton A16W4 library, pure-Python sdist on the package registry) as a bench peer.

`gemlite_layers(n, k, copies)` builds `copies` A16W4 G64 layers (bf16 activations, random 4-bit codes,
asymmetric int4 with zero point 8) for cold-weight rotation, or returns (None, why) when gemlite is
not installed or cannot build one: the caller skips the peer with that one line. Autotune "fast":
its first call at each T autotunes (outside the timed graph: the bench warms every launch first).
"""

from __future__ import annotations


def gemlite_layers(n: int, k: int, copies: int, device: str = "cuda"):
    try:
        import torch
        import gemlite
        from gemlite.helper import A16Wn
    except Exception as exc:  # not installed on this machine: the peer is skipped
        return None, f"gemlite unavailable: {type(exc).__name__}: {str(exc)[:160]}"
    try:
        gemlite.set_autotune("fast")
        layers = []
        for _ in range(max(1, copies)):
            w_q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=device)
            scales = (torch.rand(n, k // 64, device=device) * 0.02 + 1e-3).bfloat16()
            zeros = torch.full_like(scales, 8.0)
            layers.append(A16Wn(device=device, dtype=torch.bfloat16).from_weights(
                w_q, scales, zeros, W_nbits=4, group_size=64))
            del w_q
        return layers, None
    except Exception as exc:
        return None, f"gemlite A16W4 G64 {n}x{k} failed: {type(exc).__name__}: {str(exc)[:200]}"
