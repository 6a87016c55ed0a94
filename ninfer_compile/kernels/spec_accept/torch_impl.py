"""CPU path of speculative acceptance (`spec_accept`, route spec_accept_rows): the kernels' walk
over each verify row with their noise (sampling/torch_impl.py: Philox emulated in int64).

Row r (columns c = r*W + j, n = n_drafts[r] clamped to [0, W-1]): greedy columns accept the draft
d = ids[c + 1] iff it is the first index of the maximum; sampling columns accept iff
u < p(d) = exp(x_d - x_max) / z over the kept tokens (u: Philox counter (0, pos, 1, 0) word 0,
clamped below 1); the first rejection (or column n) writes its own token — the argmax, or the
Gumbel-max over the kept tokens without d where the draft is real — and `accepted[r]`. Greedy
columns' `tokens` entries hold their argmax (as the kernels' threshold pass writes them).
"""

from __future__ import annotations

import torch

from ..sampling.torch_impl import gumbel_winner, keep_threshold, philox_word0, row_key, uniform

__all__ = ["spec_accept"]

_U_MAX = torch.tensor(0.99999994, dtype=torch.float32)


def spec_accept(logits, ids, n_drafts, temperature, top_k, top_p, seed, sample_pos, tokens, accepted,
                workspace=None, **params) -> None:
    T, V = logits.shape
    C = n_drafts.shape[0]
    W = T // C
    lf = logits.float()
    best = torch.argmax(lf, dim=1)
    best_l, temps, ids_l = best.tolist(), temperature.tolist(), ids.tolist()
    toks = tokens.tolist()
    for c, t in enumerate(temps):
        if t <= 0:
            toks[c] = best_l[c]
    acc = []
    for r, n in enumerate(n_drafts.tolist()):
        n = max(0, min(int(n), W - 1))
        stop = n
        for j in range(n + 1):
            c = r * W + j
            real = j < n
            d = ids_l[c + 1] if real else -1
            if temps[c] <= 0:
                ok, own = real and d == best_l[c], best_l[c]
            else:
                x = lf[c] / temperature[c]
                xm = lf[c, best_l[c]] / temperature[c]
                tau = keep_threshold(x, xm, int(top_k[c]), float(top_p[c]))
                keep = x >= tau
                key, pos = row_key(seed[c]), int(sample_pos[c])
                ok = False
                if real and 0 <= d < V and bool(x[d] >= tau):
                    z = torch.exp(x[keep] - xm).sum()
                    pd = torch.exp(x[d] - xm) / z if float(z) > 0 else torch.tensor(0.0)
                    u = torch.minimum(uniform(philox_word0(key, 0, pos, 1, 0)), _U_MAX)
                    ok = bool(u < pd)
                own = -1
                if not ok:
                    if real and 0 <= d < V:
                        keep = keep.clone()
                        keep[d] = False
                    own = gumbel_winner(x, keep, key, pos, best_l[c])
            toks[c] = d if ok else own
            if not ok:
                stop = j
                break
        acc.append(stop)
    tokens.copy_(torch.tensor(toks, dtype=torch.int32))
    accepted.copy_(torch.tensor(acc, dtype=torch.int32))
