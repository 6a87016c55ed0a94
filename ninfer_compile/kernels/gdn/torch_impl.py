"""CPU path of the Gated DeltaNet families (gdn_gating, gdn_gating_proj, gated_delta_rule).

`gated_delta_rule` serves every route of its family with the launchers' arguments:
- with `state_columns` [R, W-1, Hv, Dk, Dv] (verify routes, W = its dim 1 + 1): R rows of W columns,
  one slot each, stepped together (W steps batched over rows); entry [r, j] = row r's state after
  its column j; `state` ends as each row's state after its last column;
- else the columns form runs of consecutive same-slot columns: when every run is one column
  (decode) one batched step; a longer run (prefill) takes the chunked form (chunks of 64 columns:
  an exact rewrite of the recurrence as triangular solves and matmuls, fp32).
q / k are L2-normalised (eps `l2_eps`), q scaled by `scale` (None: 1/sqrt(Dk)); value head j reads
q/k head j // (Hv // Hk). A run whose first column has position 0 starts from a zero state. The
state stays fp32; `out` gets one rounding at the store. Route params and the workspace are ignored.
Decode columns with distinct slots take the fused C++ step where it builds (`torch_fused`), and
gdn_gating_proj's few columns one fused C++ call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...errors import RouteError
from ..torch_util import derived, fp32_weight
from .torch_fused import fused_decode, fused_gating_proj

__all__ = ["gdn_gating", "gdn_gating_proj", "gated_delta_rule"]

CHUNK = 64


def gdn_gating(a, b, a_log, dt_bias, g, beta, workspace=None, **params) -> None:
    """g[T, Hv] = -exp(a_log) * softplus(a + dt_bias); beta[T, Hv] = sigmoid(b) (float32; the
    weights' fp32 -exp(a_log) and dt_bias made once per weight)."""
    neg_rate = derived(a_log, "neg_exp_f32", lambda t: -torch.exp(t.float()))
    bias = derived(dt_bias, "f32", lambda t: t.float())
    gv = F.softplus(a.float() + bias).mul_(neg_rate)
    bv = torch.sigmoid(b.float())
    g.copy_(gv)
    beta.copy_(bv)


def gdn_gating_proj(x, a_weight, b_weight, a_log, dt_bias, g, beta, workspace=None, **params) -> None:
    """g, beta = gdn_gating(x @ a_weight^T, x @ b_weight^T, ...) with fp32 a / b (never rounded)."""
    wa, wb = fp32_weight(a_weight), fp32_weight(b_weight)
    if fused_gating_proj(x, wa, wb, derived(a_log, "neg_exp_f32", lambda t: -torch.exp(t.float())),
                         derived(dt_bias, "f32", lambda t: t.float()), g, beta):
        return
    xf = x.float()
    gdn_gating(xf @ wa.t(), xf @ wb.t(), a_log, dt_bias, g, beta)


def _l2(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) + eps)


def _step(S, q, k, v, g, beta):
    """One recurrent step of n independent states S [n, Hv, Dk, Dv] (contiguous; updated in place);
    q, k [n, Hk, Dk] (normalised, q scaled; value head j reads head j // (Hv / Hk)), v [n, Hv, Dv],
    g, beta [n, Hv] -> o [n, Hv, Dv] fp32."""
    if not S.is_contiguous():
        tmp = S.contiguous()
        o = _step(tmp, q, k, v, g, beta)
        S.copy_(tmp)
        return o
    n, Hv, Dk, Dv = S.shape
    Hk = q.shape[1]
    S5 = S.view(n, Hk, Hv // Hk, Dk, Dv)
    S.mul_(torch.exp(g)[..., None, None])
    kk = k.view(n, Hk, 1, 1, Dk)
    u = (v - (kk @ S5).view(n, Hv, Dv)).mul_(beta[..., None])
    S5.add_(kk.transpose(-1, -2) * u.view(n, Hk, Hv // Hk, 1, Dv))
    return (q.view(n, Hk, 1, 1, Dk) @ S5).view(n, Hv, Dv)


def _chunked_run(S, q, k, v, g, beta, out_rows):
    """One sequence's columns through state S [Hv, Dk, Dv] (updated in place), in chunks: per chunk
    with in-chunk cumulative gates c, decays D[t, s] = exp(c_t - c_s) (s <= t),
    (I + L) U = diag(beta) (V - diag(e^c) K S0) with L[t, s] = beta_t D[t, s] k_t.k_s (s < t),
    O = diag(e^c) Q S0 + (D * Q K^T) U,  S = e^{c_n} S0 + K^T diag(e^{c_n - c}) U.
    q, k [n, Hv, Dk]; v [n, Hv, Dv]; g, beta [n, Hv]; writes out_rows [n, Hv, Dv] (fp32 -> dtype)."""
    n = q.shape[0]
    for c0 in range(0, n, CHUNK):
        c1 = min(n, c0 + CHUNK)
        m = c1 - c0
        Q, K, V = (t[c0:c1].transpose(0, 1) for t in (q, k, v))           # [Hv, m, D]
        cg = g[c0:c1].t().cumsum(-1)                                      # [Hv, m]
        bt = beta[c0:c1].t()                                              # [Hv, m]
        diff = cg[:, :, None] - cg[:, None, :]                            # c_t - c_s
        causal = torch.ones(m, m, dtype=torch.bool, device=q.device).tril()
        D = torch.exp(diff.masked_fill(~causal, float("-inf")))          # [Hv, m, m]
        L = (K @ K.transpose(1, 2)) * D * bt[:, :, None]
        L = L.tril(-1) + torch.eye(m, dtype=L.dtype, device=q.device)      # I + strictly lower
        ec = torch.exp(cg)                                                # [Hv, m]
        rhs = bt[:, :, None] * (V - ec[:, :, None] * (K @ S))            # [Hv, m, Dv]
        U = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
        O = ec[:, :, None] * (Q @ S) + ((Q @ K.transpose(1, 2)) * D) @ U
        out_rows[c0:c1] = O.transpose(0, 1)
        last = cg[:, -1:]                                                 # [Hv, 1]
        S.mul_(torch.exp(last)[:, :, None])
        S.add_(K.transpose(1, 2) @ (torch.exp(last - cg)[:, :, None] * U))


def gated_delta_rule(q, k, v, g, beta, state, positions, slots, out, state_columns=None, scale=None,
                     l2_eps: float = 1e-6, workspace=None, **params) -> None:
    T, Hk, Dk = q.shape
    Hv = v.shape[1]
    if Hv % Hk or state.shape[1:] != (Hv, Dk, v.shape[2]) or state.dtype != torch.float32:
        raise RouteError(f"gated_delta_rule (torch): shapes q{list(q.shape)} v{list(v.shape)} "
                         f"state{list(state.shape)} {state.dtype} (Hv a multiple of Hk, fp32 state)")
    rep = Hv // Hk
    sc = 1.0 / math.sqrt(Dk) if scale is None else float(scale)
    if state_columns is None and fused_decode(q, k, v, g, beta, state, positions, slots, out, sc, float(l2_eps)):
        return
    qk = _l2(torch.cat((q, k), dim=1), l2_eps)                           # [T, 2 Hk, Dk]
    qn, kn = qk[:, :Hk] * sc, qk[:, Hk:]
    vf, gf, bf = v.float(), g.float(), beta.float()
    if T == 1 and state_columns is None:
        S = state[slots.tolist()[0]]
        if positions.tolist()[0] == 0:
            S.zero_()
        out.copy_(_step(S[None], qn, kn, v.float(), g.float(), beta.float()))
        return
    slots_l, pos = slots.long(), positions.long()
    if state_columns is not None:
        W = state_columns.shape[1] + 1
        if W < 2 or T % W:
            raise RouteError(f"gated_delta_rule (torch): state_columns {list(state_columns.shape)} do not "
                             f"split T={T} into rows")
        R = T // W
        row_slots = slots_l[::W]
        S = state[row_slots]                                              # [R, Hv, Dk, Dv] copy
        S[pos[::W] == 0] = 0.0
        o = torch.empty(R, W, Hv, v.shape[2], dtype=torch.float32, device=q.device)
        view = (lambda t: t.view(R, W, *t.shape[1:]))
        qv, kv_, vv, gv, bv = (view(t) for t in (qn, kn, vf, gf, bf))
        for j in range(W):
            o[:, j] = _step(S, qv[:, j], kv_[:, j], vv[:, j], gv[:, j], bv[:, j])
            if j < W - 1:
                state_columns[:R, j] = S
        state[row_slots] = S
        out.copy_(o.view(T, Hv, -1))
        return
    is_start = torch.ones(T, dtype=torch.bool, device=q.device)
    is_start[1:] = slots_l[1:] != slots_l[:-1]
    starts = torch.nonzero(is_start).flatten().tolist()
    if len(starts) == T:                                                  # decode: one column per slot
        S = state[slots_l]
        S[pos == 0] = 0.0
        out.copy_(_step(S, qn, kn, vf, gf, bf))
        state[slots_l] = S
        return
    o = torch.empty(T, Hv, v.shape[2], dtype=torch.float32, device=q.device)
    for a, b in zip(starts, starts[1:] + [T]):
        S = state[int(slots_l[a])]
        if int(pos[a]) == 0:
            S.zero_()
        qr, kr = (t[a:b].repeat_interleave(rep, dim=1) if rep > 1 else t[a:b] for t in (qn, kn))
        _chunked_run(S, qr, kr, vf[a:b], gf[a:b], bf[a:b], o[a:b])
    out.copy_(o)
