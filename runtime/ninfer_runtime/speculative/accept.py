"""Acceptance rules of a speculative round, batched over slots (torch ops; no host sync inside).

Shapes (per round, B slots, K draft columns per slot):
  drafts   [B, K]    int   the proposed tokens (greedy drafters: the proposal is one-hot)
  n_valid  [B]       int   how many of the K drafts are real (an n-gram drafter may propose fewer);
                            drafts past n_valid are never accepted
  target   [B, K+1]  int   greedy: the target's argmax at each verify column
           [B, K+1, V] float  sampling: the target's (filtered) probabilities at each column
Column j of the target follows the slot's last accepted token and drafts[:, :j].

Greedy: accept the longest prefix with drafts[j] == argmax_j; emit argmax at the first mismatch (the
correction) or argmax_K after all K (the bonus).
Sampling (one-hot proposal q = delta(d_j)): accept d_j with probability min(1, p_j(d_j) / q_j(d_j)) =
p_j(d_j); at the first rejection sample from the residual max(0, p_j - q_j) renormalised = p_j with d_j
removed; after K accepted drafts sample the bonus from p_K. The emitted tokens are then distributed
exactly as sampling from the target token by token (Leviathan et al. 2023, Chen et al. 2023).
Randomness comes from `uniforms` [B, K+1] in [0, 1): one per column (the accept test at j < K; the
residual / bonus draw reuses the column's second uniform `uniforms2`), so a caller with per-slot seeded
streams gets per-slot reproducible rounds independent of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RoundOutcome:
    """accepted [B] = drafts kept (0..K); next_token [B] = the target's own token after them;
    emitted = accepted + 1 tokens per slot: drafts[:accepted] then next_token."""

    accepted: torch.Tensor
    next_token: torch.Tensor

    def tokens(self, drafts: torch.Tensor) -> list[list[int]]:
        """Host lists of the emitted tokens per slot (one device->host read of both tensors)."""
        acc = self.accepted.tolist()
        nxt = self.next_token.tolist()
        d = drafts.tolist()
        return [d[b][:acc[b]] + [nxt[b]] for b in range(len(acc))]


def _valid_mask(drafts: torch.Tensor, n_valid: torch.Tensor | None) -> torch.Tensor:
    B, K = drafts.shape
    if n_valid is None:
        return torch.ones(B, K, dtype=torch.bool, device=drafts.device)
    return torch.arange(K, device=drafts.device)[None, :] < n_valid.to(drafts.device)[:, None]


def greedy_accept(drafts: torch.Tensor, target_argmax: torch.Tensor,
                  n_valid: torch.Tensor | None = None) -> RoundOutcome:
    """drafts [B, K], target_argmax [B, K+1] -> RoundOutcome."""
    B, K = drafts.shape
    if target_argmax.shape != (B, K + 1):
        raise ValueError(f"target_argmax must be [{B}, {K + 1}], got {list(target_argmax.shape)}")
    ok = (drafts.to(target_argmax.dtype) == target_argmax[:, :K]) & _valid_mask(drafts, n_valid)
    accepted = torch.cumprod(ok.to(torch.int32), dim=1).sum(dim=1)  # [B]: leading run of matches
    next_token = torch.gather(target_argmax, 1, accepted.to(torch.int64)[:, None])[:, 0]
    return RoundOutcome(accepted, next_token)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [B, V] (rows sum to > 0), u [B] in [0, 1) -> ids [B]."""
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:]
    idx = torch.searchsorted(cdf, (u[:, None] * total).contiguous(), right=True)[:, 0]
    return idx.clamp_(max=probs.shape[-1] - 1)


def speculative_accept(drafts: torch.Tensor, target_probs: torch.Tensor, uniforms: torch.Tensor,
                       uniforms2: torch.Tensor, n_valid: torch.Tensor | None = None) -> RoundOutcome:
    """drafts [B, K], target_probs [B, K+1, V] (each row a distribution), uniforms / uniforms2 [B, K+1]
    -> RoundOutcome. Exact speculative sampling for a one-hot (greedy) proposal."""
    B, K = drafts.shape
    V = target_probs.shape[-1]
    if target_probs.shape[:2] != (B, K + 1) or uniforms.shape != (B, K + 1) or uniforms2.shape != (B, K + 1):
        raise ValueError("target_probs must be [B, K+1, V] and uniforms [B, K+1]")
    d = drafts.to(torch.int64)
    p_draft = torch.gather(target_probs[:, :K, :], 2, d[:, :, None])[:, :, 0]  # [B, K]
    ok = (uniforms[:, :K].to(p_draft.dtype) < p_draft) & _valid_mask(drafts, n_valid)
    accepted = torch.cumprod(ok.to(torch.int32), dim=1).sum(dim=1)  # [B]
    a = accepted.to(torch.int64)
    rows = target_probs[torch.arange(B, device=target_probs.device), a]  # [B, V]: p at the stop column
    # residual at a rejected real draft: p with that draft removed (renormalised by _draw);
    # at a == K (all accepted) or at an invalid draft column, the plain p (the bonus / a normal sample)
    rejected_real = a < K
    if n_valid is not None:
        rejected_real &= a < n_valid.to(a.device)
    d_at = torch.gather(torch.cat([d, torch.zeros(B, 1, dtype=torch.int64, device=d.device)], 1), 1, a[:, None])[:, 0]
    remove = torch.zeros(B, V, dtype=rows.dtype, device=rows.device)
    remove.scatter_(1, d_at[:, None], rows.gather(1, d_at[:, None]))
    rows = rows - remove * rejected_real[:, None].to(rows.dtype)
    u = torch.gather(uniforms2, 1, a[:, None])[:, 0].to(rows.dtype)
    next_token = _draw(rows, u)
    return RoundOutcome(accepted, next_token)
