"""fp32 PyTorch references of token selection.

argmax(logits [T, V]) -> ids [T] int64 (first index of the maximum, as torch.argmax).
sample(logits, temperature, top_k, top_p, seed, sample_pos) -> ids [R] int32, per-row parameters
(the family reference the IR executor runs).
filtered_probs(logits, temperature, top_k, top_p) -> the distribution sampling draws from [T, V]:
softmax(logits / temperature) restricted to the top_k largest logits (top_k <= 0: all) and then
to the smallest prefix of the descending-sorted tokens whose cumulative probability reaches
top_p (top_p >= 1: all; the most likely token is always kept), renormalised.
"""

from __future__ import annotations

import torch


def argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits.float(), dim=-1)


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    x = logits.float() / max(temperature, 1e-6)
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, dim=-1, descending=True)
        cum = sp.cumsum(-1)
        drop = (cum - sp) >= top_p  # tokens entirely beyond the nucleus
        drop[..., 0] = False
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seed: torch.Tensor, sample_pos: torch.Tensor, mode: str = "per_slot") -> torch.Tensor:
    """ids [R] int32: row r greedy (argmax) when temperature[r] <= 0, else one draw from
    filtered_probs(logits[r], temperature[r], top_k[r], top_p[r]) (a torch.Generator seeded from the
    row's seed and sample_pos: the same distribution as the kernels, not the same noise)."""
    R = logits.shape[0]
    out = argmax(logits).to(torch.int32)
    for r in range(R):
        t = float(temperature[r])
        if t <= 0:
            continue
        probs = filtered_probs(logits[r:r + 1], t, int(top_k[r]), float(top_p[r]))[0]
        lo, hi = (int(v) & 0xFFFFFFFF for v in seed[r].tolist())
        g = torch.Generator().manual_seed(((hi << 32 | lo) ^ (int(sample_pos[r]) * 0x9E3779B97F4A7C15)) & (2**63 - 1))
        out[r] = int(torch.multinomial(probs.cpu(), 1, generator=g))
    return out
