"""Greedy acceptance of the MTP draft head on a text, measured with the float32 reference.

At every `every`-th position t of the text (from `start` on) one speculative round is simulated
exactly as greedy speculative decoding would run it from the true prefix x[0..t]:

- the target's greedy token g0 = argmax p(. | x[0..t]) is the round's bonus token;
- the MTP head drafts d1..dK autoregressively: column 1 pairs the target's final-norm hidden state
  at t with g0 (RoPE position t), column i > 1 pairs the head's own output hidden state of column
  i-1 with d(i-1) (position t+i-1); its KV cache holds the columns (h_j, x[j+1]) of every earlier
  position j of the text, as it would after a prefill;
- the target verifies greedily: g_i = argmax p(. | x[0..t], g0, g1..g(i-1)); the round accepts the
  longest prefix with d_i == g_i (L tokens, L <= K).

Drafts do not depend on K (each is the chain's next greedy token), so one round with K_max drafts
gives every K <= K_max: accepted(K) = min(L, K). Reported per K: the acceptance rate (accepted
drafts / drafted tokens) and tokens per round (1 + accepted: the bonus/correction token counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .model import linear


@dataclass
class AcceptanceResult:
    k_max: int
    rounds: int
    accepted_runs: list[int] = field(default_factory=list)  # L per round (0..k_max)
    vocab: int = 0

    def accepted(self, k: int) -> float:
        """Mean accepted drafts per round with a draft window of k."""
        return sum(min(L, k) for L in self.accepted_runs) / max(1, self.rounds)

    def acceptance_rate(self, k: int) -> float:
        return self.accepted(k) / k

    def tokens_per_round(self, k: int) -> float:
        return 1.0 + self.accepted(k)

    def table(self) -> list[dict]:
        return [{"k": k, "acceptance": self.acceptance_rate(k), "tokens_per_round": self.tokens_per_round(k)}
                for k in range(1, self.k_max + 1)]


@torch.no_grad()
def mtp_acceptance(model, ids: list[int], *, k_max: int = 5, every: int = 8, start: int = 16) -> AcceptanceResult:
    """Simulated greedy speculative rounds over `ids` (see the module docstring)."""
    if len(ids) < start + 2:
        raise ValueError(f"need at least {start + 2} tokens, got {len(ids)}")
    mtp = model.mtp
    head = model.weights.output_head
    st, mst = model.new_state(), mtp.new_state()
    res = AcceptanceResult(k_max=k_max, rounds=0, vocab=int(head.shape[0]))
    pos, prev_h = 0, None
    for t in range(start, len(ids) - 1, every):
        logits = model.prefill(ids[pos:t + 1], st)                 # target consumes x[pos..t]
        hid = st.hidden                                             # [t+1-pos, H]
        # MTP columns j = mst.position .. t-1: (h_j, x[j+1])
        cols_h = hid[:-1] if prev_h is None else torch.cat([prev_h[None], hid[:-1]])
        cols_x = ids[mst.position + 1:t + 1]
        if cols_x:
            mtp.hidden(cols_x, cols_h, mst)
        prev_h, pos = hid[-1], t + 1
        g = int(logits[-1].argmax())
        tst, mct = st.clone(), mst.clone()
        h, L = hid[-1:], 0
        tok = g
        for _ in range(k_max):
            mh = mtp.hidden([tok], h, mct)
            draft = int(linear(mh, head)[0].argmax())
            target = int(model.decode(tok, tst).argmax())
            if draft != target:
                break
            L += 1
            h, tok = mh, draft
        res.accepted_runs.append(L)
        res.rounds += 1
    return res
