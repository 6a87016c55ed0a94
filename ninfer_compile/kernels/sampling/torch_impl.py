"""CPU path of token selection (`sampling`, route sample_per_slot; alias `sample`): the kernels' rule and noise.

Row r: greedy (temperature <= 0): the first index of the raw maximum. Sampled: x = logits /
temperature (fp32), the kernels' exact keep threshold tau (top-k: the k-th largest x, ties kept;
then top-p: the smallest kept value whose strictly-higher mass is below top_p of the kept mass),
then the Gumbel-max over the kept tokens with the kernels' noise: Philox-4x32-10 (key = the row's
64-bit seed, counter = (token, sample_pos, 0, 0)) word 0 as a uniform, -log(-log(u)) — emulated
with int64 arithmetic, so the torch path draws the tokens the Triton kernels draw (up to float
rounding of exp / log in near ties). These helpers are shared with spec_accept's CPU path.
When every row is greedy, one fused C++ pass finds the argmaxes where it builds (`torch_fused`).
"""

from __future__ import annotations

import torch

from .torch_fused import fused_argmax

__all__ = ["sampling", "sample", "philox_word0", "uniform", "gumbel", "keep_threshold", "row_key"]

_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_U_SCALE = torch.tensor(4.6566127342e-10, dtype=torch.float32)
_U_LO = torch.tensor(1e-10, dtype=torch.float32)
_U_HI = torch.tensor(1.0 - 1e-7, dtype=torch.float32)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of the 64-bit product of the constant a and uint32 values b (int64)."""
    p_lo = b * (a & 0xFFFF)
    p_hi = b * (a >> 16)
    return (p_hi + (p_lo >> 16)) >> 16, (p_lo + ((p_hi & 0xFFFF) << 16)) & _M32


def philox_word0(key: int, c0, c1, c2, c3) -> torch.Tensor:
    """Word 0 of Philox-4x32-10 (Triton's tl.philox) for key (64 bits) and counters (int64 tensors
    or ints, uint32 values, broadcast together) -> int64 tensor of uint32 values."""
    c0, c1, c2, c3 = torch.broadcast_tensors(*(torch.as_tensor(c, dtype=torch.int64) for c in (c0, c1, c2, c3)))
    k0, k1 = key & _M32, (key >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0


def uniform(x: torch.Tensor) -> torch.Tensor:
    """uint32 (int64 values) -> float32 in [0, 1), as the kernels' _uniform."""
    i = torch.where(x >= 1 << 31, x - (1 << 32), x)
    i = torch.where(i < 0, -i - 1, i)
    return i.to(torch.float32) * _U_SCALE


def gumbel(key: int, pos: int, cols: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise of tokens `cols` at position `pos` (the kernels' sampling.gumbel)."""
    u = uniform(philox_word0(key, cols.long(), pos & _M32, 0, 0))
    u = torch.minimum(torch.maximum(u, _U_LO), _U_HI)
    return -torch.log(-torch.log(u))


def row_key(seed_row) -> int:
    """The 64-bit Philox key of a seed row [2] int32 (low word first)."""
    lo, hi = (int(v) & _M32 for v in seed_row.tolist())
    return (hi << 32) | lo


def keep_threshold(x: torch.Tensor, xm: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """tau (0-dim fp32): keep x >= tau. top-k: the k-th largest x; top-p over the top-k survivors:
    the smallest kept value whose strictly-higher mass sum(exp(x - xm)) is below top_p of theirs."""
    V = x.shape[0]
    tau = torch.tensor(float("-inf"))
    if 0 < top_k < V:
        tau = torch.topk(x, top_k).values[-1]
    if top_p < 1.0:
        sv = torch.sort(x[x >= tau], descending=True).values
        e = torch.exp(sv - xm)
        goal = torch.tensor(top_p, dtype=torch.float32) * e.sum()
        n_keep = int(((e.cumsum(0) - e) < goal).sum())
        tau = sv[max(n_keep, 1) - 1]
    return tau


def gumbel_winner(x: torch.Tensor, keep: torch.Tensor, key: int, pos: int, fallback: int) -> int:
    """The first token of the maximum of x + Gumbel noise over `keep` (fallback: none kept)."""
    cols = torch.nonzero(keep).flatten()
    if cols.numel() == 0:
        return fallback
    s = x[cols] + gumbel(key, pos, cols)
    if not bool(torch.isfinite(s).any()):
        return fallback
    return int(cols[torch.argmax(s)])


def sampling(logits, temperature, top_k, top_p, seed, sample_pos, ids, workspace=None, **params) -> None:
    """ids[r] = argmax(logits[r]) where temperature[r] <= 0, else the kernels' draw."""
    temps = temperature.tolist()
    if max(temps, default=0.0) <= 0 and fused_argmax(logits, ids):
        return
    lf = logits.float()
    best = torch.argmax(lf, dim=1)
    out = best.to(torch.int32)
    for r, t in enumerate(temps):
        if t <= 0:
            continue
        x = lf[r] / temperature[r]
        xm = lf[r, best[r]] / temperature[r]
        tau = keep_threshold(x, xm, int(top_k[r]), float(top_p[r]))
        out[r] = gumbel_winner(x, x >= tau, row_key(seed[r]), int(sample_pos[r]), int(best[r]))
    ids.copy_(out)


sample = sampling  # the launcher's name
