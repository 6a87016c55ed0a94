"""fp32 PyTorch reference of speculative acceptance (the family definition is spec.py's docstring).

spec_accept(logits [T, V], ids [T] i32, n_drafts [C] i32, temperature [T] f32, top_k [T] i32,
top_p [T] f32, seed [T, 2] i32, sample_pos [T] i32) -> (tokens [T] i32, accepted [C] i32).

T = C * W columns; row r's column j (c = r*W + j) holds the token before draft j + 1
(`ids[c + 1]`, for j < K = W - 1). Walking j = 0, 1, ..:
- j < n_drafts[r] (a real draft d = ids[c + 1]): greedy column (temperature[c] <= 0): accept iff
  d == argmax(logits[c]) (first index of the maximum); sampling column: accept iff u < p_c(d)
  with p_c = sampling.reference.filtered_probs(logits[c], temperature[c], top_k[c], top_p[c]) and
  u uniform in [0, 1). Accepted: tokens[c] = d, next column. Rejected: tokens[c] = argmax (greedy)
  or a draw from the residual p_c with d removed, renormalised (sampling); accepted[r] = j; stop.
- j == n_drafts[r] (all real drafts accepted): tokens[c] = argmax or a draw from p_c itself (the
  bonus at j = K, a plain sample at an earlier cut: the draft there is not real); accepted[r] = j.
Entries of `tokens` past row r's stop column are 0 here (unspecified by the family).

Randomness: one torch.Generator per sampling column, seeded from (seed[c], sample_pos[c]) as
sampling.reference.sample does; it draws the accept uniform first, then the residual / bonus
token. The same distribution as the kernels, not the same noise.
"""

from __future__ import annotations

import torch

from ..sampling.reference import filtered_probs


def _generator(seed_row: torch.Tensor, pos: int) -> torch.Generator:
    lo, hi = (int(v) & 0xFFFFFFFF for v in seed_row.tolist())
    return torch.Generator().manual_seed(((hi << 32 | lo) ^ (int(pos) * 0x9E3779B97F4A7C15)) & (2**63 - 1))


def _draw(probs: torch.Tensor, g: torch.Generator) -> int:
    """One token from probs [V] (float64 on the CPU); the argmax when nothing is left."""
    if float(probs.sum()) <= 0:
        return int(torch.argmax(probs))
    return int(torch.multinomial(probs, 1, generator=g))


def accept_row(logits: torch.Tensor, ids: torch.Tensor, n: int, temperature: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor, seed: torch.Tensor, sample_pos: torch.Tensor) -> tuple[list[int], int]:
    """One verify row: logits [W, V], ids / parameters [W] ([W, 2] seed), n real drafts ->
    (emitted tokens: accepted drafts then the target's own, accepted)."""
    W = logits.shape[0]
    n = max(0, min(int(n), W - 1))
    out: list[int] = []
    for j in range(n + 1):
        t = float(temperature[j])
        real = j < n
        d = int(ids[j + 1]) if real else -1
        if t <= 0:
            tok = int(torch.argmax(logits[j].float()))
            if real and d == tok:
                out.append(d)
                continue
            out.append(tok)
            return out, j
        p = filtered_probs(logits[j:j + 1], t, int(top_k[j]), float(top_p[j]))[0].double().cpu()
        g = _generator(seed[j], int(sample_pos[j]))
        u = float(torch.rand((), generator=g, dtype=torch.float64))
        if real:
            pd = float(p[d]) if 0 <= d < p.shape[0] else 0.0
            if u < pd:
                out.append(d)
                continue
            if 0 <= d < p.shape[0]:
                p = p.clone()
                p[d] = 0.0  # the residual max(0, p - onehot(d)) up to normalisation
        out.append(_draw(p, g))
        return out, j
    raise AssertionError("unreachable: column n always stops")


def spec_accept(logits: torch.Tensor, ids: torch.Tensor, n_drafts: torch.Tensor, temperature: torch.Tensor,
                top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor,
                sample_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    T = logits.shape[0]
    C = n_drafts.shape[0]
    W = T // C
    tokens = torch.zeros(T, dtype=torch.int32, device=logits.device)
    accepted = torch.zeros(C, dtype=torch.int32, device=logits.device)
    for r in range(C):
        s = slice(r * W, (r + 1) * W)
        toks, a = accept_row(logits[s], ids[s], int(n_drafts[r]), temperature[s], top_k[s], top_p[s], seed[s],
                             sample_pos[s])
        tokens[r * W: r * W + len(toks)] = torch.tensor(toks, dtype=torch.int32)
        accepted[r] = a
    return tokens, accepted
