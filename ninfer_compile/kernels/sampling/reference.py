"""fp32 PyTorch references of token selection.

argmax(logits [T, V]) -> ids [T] int64 (first index of the maximum, as torch.argmax).
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
