"""Token selection from logits: greedy, or temperature with optional top-k / top-p, seeded.

Every sequence carries its own `SamplingParams` and, when it samples, its own `torch.Generator`
seeded from `seed`, so a sequence's tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """`temperature` 0 (or `greedy=True`) = argmax. `top_k` 0 = off; `top_p` 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    greedy: bool | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        if self.greedy is not None:
            return bool(self.greedy)
        return self.temperature == 0.0

    def generator(self, device) -> torch.Generator | None:
        if self.is_greedy:
            return None
        g = torch.Generator(device=device)
        g.manual_seed(int(self.seed))
        return g


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Float32 probabilities [V] after temperature, top-k and top-p (nucleus) filtering."""
    x = logits.float() / max(float(temperature), 1e-6)
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(x, top_k).values[-1]
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sp, idx = torch.sort(probs, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        drop = (cum - sp) > top_p  # keep the smallest prefix whose mass reaches top_p (>= 1 token)
        sp = torch.where(drop, torch.zeros_like(sp), sp)
        probs = torch.zeros_like(probs).scatter_(0, idx, sp)
    return probs / probs.sum()


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from one logits row [V]."""
    if params.is_greedy:
        return int(torch.argmax(logits.float()).item())
    probs = filter_logits(logits, params.temperature, params.top_k, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> list[int]:
    """Token ids for rows of logits [R, V] (row i with params[i], generators[i])."""
    if all(p.is_greedy for p in params):
        return [int(v) for v in torch.argmax(logits[: len(params)].float(), dim=-1).tolist()]
    return [sample_row(logits[i], p, g) for i, (p, g) in enumerate(zip(params, generators))]
